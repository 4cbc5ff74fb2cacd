#!/usr/bin/env python3
"""Facts about vLLM's KV events, Prometheus metrics and KV offload config, read from its source.

    pip download --no-deps vllm==0.34.0 -d wheels && unzip -q wheels/vllm-*.whl -d src
    VLLM_SRC=src python tools/vllm_reference.py [OUT]        # OUT defaults to DEFAULT_OUT
    VLLM_SRC=src python tools/vllm_reference.py --check FILE  # exit 1 if FILE is out of date

Nothing of vLLM is imported: `ast` only. A value is taken when it is a literal, directly or through
a named constant (also one imported from a vllm module), a class attribute, the last assignment of
a local (or self.x) before its use, a dict entry, or a keyword of the call that built an object
(`DEFS[NAME].documentation`). Anything else is null, never a guess. Metric sites are looked for
in the files under vllm/ (not vllm/benchmarks) whose text has "vllm:", "documentation=" or
"Offloading*Metadata(".
  * labelnames: "<engine labels>" is the list PrometheusStatLogger hands its sub-loggers (a
    `labelnames` parameter or `self._labelnames`), given as "engine_labels". Offloading*Metadata
    metrics get it before their own labelnames, as OffloadPromMetrics._create_metric does.
  * histogram buckets: a literal list, "<prometheus_client default>" when none is passed, or null;
    "bucket_family" names a histogram_buckets(family) call (see "histogram_bucket_families").
  * a family built at several sites shows its constructor site; "other_sites" lists the rest.
    A "vllm:" literal with no site has type "unknown".
  * default_kind: literal | constant (through a name: default_expr) | absent (.get() without a
    default gives None) | required | unresolved (default_expr).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SRC = Path(os.environ.get("VLLM_SRC", "src"))
DEFAULT_OUT = "tests/data/vllm_0.34.0_reference.json"
ENGINE, PROM_DEFAULT = "<engine labels>", "<prometheus_client default>"
METRIC_RE = re.compile(r"vllm:[A-Za-z_]\w*")
CTOR_RE = re.compile(r"_(counter|gauge|histogram)_cls|(Counter|Gauge|Histogram|Summary)")
META_RE = re.compile(r"Offloading(Counter|Gauge|Histogram)Metadata")
SITE_TEXT_RE = re.compile(r"vllm:|documentation=|Offloading\w+Metadata\(")
KVO, CONN = "vllm/v1/kv_offload", "vllm/distributed/kv_transfer/kv_connector"
LOGGERS, STATS = "vllm/v1/metrics/loggers.py", "vllm/v1/metrics/stats.py"
HITS, BUCKETS = "vllm/v1/metrics/cache_hit_source.py", "vllm/v1/metrics/buckets.py"
OFFM = f"{CONN}/v1/offloading/metrics.py"
LABEL_VALUES = {  # "metric label" -> (file, class whose __init__ locals are in scope, expression)
    "vllm:admission_rejections reason": (LOGGERS, "", "ADMISSION_REASONS"),
    "vllm:engine_sleep_state sleep_state": (LOGGERS, "PrometheusStatLogger", "sleep_state"),
    "vllm:prompt_tokens_by_source source": (STATS, "", "PromptTokenStats.ALL_SOURCES"),
    "vllm:kv_offload_{total_bytes,total_time,size} transfer_type": (OFFM, "", "_TransferType.ALL"),
}
GAPS = [
    "histogram_bucket_families.request_tokens: computed (1-2-5 series up to max_model_len)",
    "backpressure: high_water_s/low_water_s (and failure_threshold) defaults come from the "
    "detector's default_config(tier_type, locality), code not read here",
    "tier_types: an out-of-tree tier (type = class name + module_path) takes any keys",
]
Scope = dict[str, list[ast.expr]]
Stack = tuple[ast.AST, ...]


class Unresolved(Exception):
    """Raised for a value the source does not give as a literal."""


@dataclass
class Mod:
    """One parsed vLLM source file with its top-level names."""

    rel: str
    tree: ast.Module
    consts: Scope = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)


@dataclass
class Ctx:
    """Where an expression lives: its module, local scopes (innermost first) and parameters."""

    mod: Mod
    scopes: tuple[Scope, ...] = ()
    params: frozenset[str] = frozenset()


_MODS: dict[str, Mod] = {}


def assigns(nodes: Iterable[ast.AST]) -> Scope:
    """Name (or "self.x") -> values, in source order, of the simple assignments among nodes."""
    scope: Scope = {}
    for node in sorted((n for n in nodes if isinstance(n, ast.stmt)), key=lambda n: n.lineno):
        pairs = [(t, node.value) for t in node.targets] if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign) and node.value:
            pairs = [(node.target, node.value)]
        for target, val in pairs:
            if re.fullmatch(r"(self\.)?\w+", key := ast.unparse(target)):
                scope.setdefault(key, []).append(val)
    return scope


def load(rel: str) -> Mod:
    """Parse (once) the file at this path relative to $VLLM_SRC."""
    if rel not in _MODS:
        mod = _MODS[rel] = Mod(rel, ast.parse((SRC / rel).read_text(), rel))
        for node in mod.tree.body:
            if isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                mod.imports.update({a.asname or a.name: node.module for a in node.names})
        mod.consts = assigns(mod.tree.body)
    return _MODS[rel]


def module_rel(dotted: str) -> str:
    """Relative path of a dotted module."""
    base = dotted.replace(".", "/")
    return f"{base}.py" if (SRC / f"{base}.py").is_file() else f"{base}/__init__.py"


def find(name: str, mod: Mod) -> Iterator[Mod]:
    """mod, then the vllm module (present in $VLLM_SRC) that name is imported from."""
    yield mod
    if name in mod.imports and (SRC / (rel := module_rel(mod.imports[name]))).is_file():
        yield load(rel)


def find_class(name: str, mod: Mod) -> tuple[ast.ClassDef, Mod] | None:
    """A class defined in mod or imported into it."""
    return next(((m.classes[name], m) for m in find(name, mod) if name in m.classes), None)


def call_name(node: ast.AST) -> str:
    """The called name of a call (`f(...)` or `x.f(...)`), else ""."""
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def deref(node: ast.expr, ctx: Ctx, depth: int = 0) -> tuple[ast.expr, Ctx]:
    """Follow names, class attributes, dict lookups and call keywords to a defining expression."""
    key, nxt = ast.unparse(node), depth + 1
    for scope in ctx.scopes if depth < 30 else ():
        if before := [v for v in scope.get(key, []) if v.lineno < node.lineno]:
            return deref(before[-1], ctx, nxt)
    if depth >= 30 or key in ctx.params:
        return node, ctx
    if isinstance(node, ast.Name):
        for m in find(node.id, ctx.mod):
            if node.id in m.consts:
                return deref(m.consts[node.id][-1], Ctx(m), nxt)
    elif isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and (owner := find_class(node.value.id, ctx.mod)):
            body = assigns(owner[0].body)
            found = node.attr in body
            return deref(body[node.attr][-1], Ctx(owner[1], (body,)), nxt) if found else (node, ctx)
        target, tctx = deref(node.value, ctx, nxt)
        for kw in target.keywords if isinstance(target, ast.Call) else []:
            if kw.arg == node.attr:
                return deref(kw.value, tctx, nxt)
    elif isinstance(node, ast.Subscript):
        target, tctx = deref(node.value, ctx, nxt)
        if isinstance(target, ast.Dict) and (want := value(node.slice, ctx)) is not None:
            for k, v in zip(target.keys, target.values, strict=True):
                if k is not None and value(k, tctx) == want:
                    return deref(v, tctx, nxt)
    return node, ctx


def lit(node: ast.expr, ctx: Ctx, depth: int = 0) -> Any:
    """The literal value of an expression, or raise Unresolved."""
    if depth > 30:
        raise Unresolved
    sub = depth + 1
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        return [lit(e, ctx, sub) for e in node.elts]
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
        return {lit(k, ctx, sub): lit(v, ctx, sub) for k, v in pairs if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -lit(node.operand, ctx, sub)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return lit(node.left, ctx, sub) + lit(node.right, ctx, sub)
    if isinstance(node, ast.Call) and call_name(node) in ("list", "tuple") and len(node.args) == 1:
        return lit(node.args[0], ctx, sub)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
        return lit(node.slice, ctx, sub)
    if isinstance(node, ast.Name | ast.Attribute | ast.Subscript):
        target, tctx = deref(node, ctx)
        if target is not node:
            return lit(target, tctx, sub)
        text = ast.unparse(node)
        if text == "self._labelnames" or (text == "labelnames" and text in ctx.params):
            return [ENGINE]
    raise Unresolved


def value(node: ast.expr | None, ctx: Ctx) -> Any:
    """The literal value of an expression, or None when it has none."""
    try:
        return None if node is None else lit(node, ctx)
    except (Unresolved, TypeError):
        return None


def read(rel: str, cls: str, text: str) -> Any:
    """The value of an expression at the end of a file, or of a class's __init__."""
    mod, expr = load(rel), ast.increment_lineno(ast.parse(text, mode="eval"), 10**9).body
    inits = (
        [n for n in mod.classes[cls].body if getattr(n, "name", "") == "__init__"] if cls else []
    )
    return value(expr, Ctx(mod, tuple(assigns(ast.walk(f)) for f in inits)))


def default_of(node: ast.expr | None, ctx: Ctx, missing: str = "absent") -> dict[str, Any]:
    """Describe a default value (see default_kind in the module docstring)."""
    if isinstance(node, ast.Call) and call_name(node) == "field":
        kws = {k.arg: k.value for k in node.keywords}
        node = kws.get("default", kws.get("default_factory"))
    if node is None:
        return {"default": None, "default_kind": missing}
    try:
        got, expr = lit(node, ctx), {"default_expr": ast.unparse(node)}
    except (Unresolved, TypeError):
        return {"default": None, "default_kind": "unresolved", "default_expr": ast.unparse(node)}
    if isinstance(node, ast.Constant | ast.List | ast.Tuple | ast.UnaryOp):
        return {"default": got, "default_kind": "literal"}
    return {"default": got, "default_kind": "constant"} | expr


def walk(node: ast.AST, stack: Stack = ()) -> Iterator[tuple[ast.AST, Stack]]:
    """Every node below node with its ancestors."""
    yield node, stack
    for child in ast.iter_child_nodes(node):
        yield from walk(child, (*stack, node))


def ctx_at(mod: Mod, stack: Stack) -> Ctx:
    """The context of a node: the locals and parameters of its innermost function."""
    for node in reversed(stack):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = frozenset(p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs])
            return Ctx(mod, (assigns(ast.walk(node)),), names)
    return Ctx(mod)


def loop_rows(var: ast.expr, stack: Stack, ctx: Ctx) -> list[Scope]:
    """Bindings of a loop variable unpacked from a local list of tuples, one per row."""
    name = ast.unparse(var)
    for node in reversed(stack):
        for gen in getattr(node, "generators", [node] if isinstance(node, ast.For) else []):
            names = [ast.unparse(e) for e in getattr(gen.target, "elts", [])]
            if name in names and isinstance(gen.iter, ast.Name) and ctx.scopes:
                lists = ctx.scopes[0].get(gen.iter.id, [])
                rows = [r for v in lists for r in getattr(v, "elts", [])]
                rows = [r for r in rows if len(getattr(r, "elts", [])) == len(names)]
                return [{n: [e] for n, e in zip(names, r.elts, strict=True)} for r in rows]
    return []


def arg(call: ast.Call, kw: str, pos: int) -> ast.expr | None:
    """A call argument by keyword, else by position."""
    found = [k.value for k in call.keywords if k.arg == kw]
    plain = not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1])
    return found[0] if found else call.args[pos] if plain and len(call.args) > pos else None


def metric_sites(mod: Mod) -> Iterator[tuple[Any, str, dict[str, Any]]]:
    """(name, name expression, facts) of each metric constructor call or offloading metadata."""
    for node, stack in walk(mod.tree):
        pairs: list[tuple[ast.expr | None, ast.expr]] = []
        if isinstance(node, ast.Call):
            pairs = [(None, node)]
        elif isinstance(node, ast.Dict):
            pairs = [(k, v) for k, v in zip(node.keys, node.values, strict=True) if k]
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            pairs = [(node.targets[0].slice, node.value)]
        for key, call in pairs:  # metadata (a key given) has no name argument
            kind = (CTOR_RE if key is None else META_RE).fullmatch(call_name(call))
            off = 0 if key is None else 1
            if not kind or not isinstance(call, ast.Call):
                continue
            name_e = arg(call, "name", 0) if key is None else key
            doc_e, labels_e = arg(call, "documentation", 1 - off), arg(call, "labelnames", 2 - off)
            if name_e is None or doc_e is None:
                continue  # not a Prometheus metric (e.g. collections.Counter)
            ctx, mtype = ctx_at(mod, stack), next(g for g in kind.groups() if g).lower()
            rows = loop_rows(name_e, stack, ctx)
            for row in rows or [{}]:
                rctx = Ctx(mod, (row, *ctx.scopes), ctx.params)
                labels = value(labels_e, rctx) if labels_e else []
                facts = {"file": mod.rel, "type": mtype, "documentation": value(doc_e, rctx)}
                facts["defined_via"] = "offloading metadata" if key else "constructor"
                facts["labelnames"] = [ENGINE, *labels] if key and labels is not None else labels
                if mtype == "histogram":
                    facts |= buckets_of(arg(call, "buckets", 2 if key else 99), rctx)
                yield value(name_e, rctx), ast.unparse(name_e), facts


def buckets_of(node: ast.expr | None, ctx: Ctx) -> dict[str, Any]:
    """The buckets of a histogram (see the module docstring)."""
    target, tctx = deref(node, ctx) if node else (node, ctx)
    if isinstance(target, ast.Call) and call_name(target) == "histogram_buckets":
        return {"buckets": None, "bucket_family": value(target.args[0], tctx)}
    return {"buckets": value(node, ctx) if node else PROM_DEFAULT}


def metrics(files: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """All vllm: metric families in these files, and the sites whose name is no literal."""
    found: dict[str, list[dict[str, Any]]] = {}
    literal_in: dict[str, set[str]] = {}
    gaps = set()
    for mod in map(load, files):
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Constant) and METRIC_RE.fullmatch(str(node.value)):
                literal_in.setdefault(str(node.value), set()).add(mod.rel)
        for name, expr, facts in metric_sites(mod):
            if not isinstance(name, str):
                gaps.add(f"metric name not a literal: {mod.rel} ({facts['defined_via']}): {expr}")
            elif name.startswith("vllm:"):
                found.setdefault(name, []).append(facts)
    out = []
    for name in sorted(found.keys() | literal_in.keys()):
        sites = sorted(
            found.get(name, []), key=lambda s: (s["defined_via"] != "constructor", s["file"])
        )
        rest = sorted({f"{s['file']} ({s['defined_via']})" for s in sites[1:]})
        first = sites[0] if sites else {"file": min(literal_in[name]), "type": "unknown"}
        out.append({"name": name, **first} | ({"other_sites": rest} if rest else {}))
        unknown = [k for k in ("labelnames", "documentation", "buckets") if first.get(k, 1) is None]
        gaps.update(f"{name}: {k} not a literal" for k in unknown if "bucket_family" not in first)
    return out, sorted(gaps)


def struct(mod: Mod, name: str) -> dict[str, Any]:
    """Fields (in msgspec/dataclass order: bases first) and class options of a struct class."""
    chain: list[ast.ClassDef] = []
    while name in mod.classes:
        chain.insert(0, mod.classes[name])
        name = next((b.id for b in chain[0].bases if isinstance(b, ast.Name)), "")
    fields: dict[str, dict[str, Any]] = {}  # a redefined field keeps its position
    for st in (st for c in chain for st in c.body if isinstance(st, ast.AnnAssign)):
        fact = {"name": ast.unparse(st.target), "type": ast.unparse(st.annotation)}
        fact |= default_of(st.value, Ctx(mod), "required")
        fields[fact["name"]] = fact | {"has_default": fact["default_kind"] != "required"}
    options = {kw.arg: value(kw.value, Ctx(mod)) for c in chain for kw in c.keywords if kw.arg}
    return {"bases": [c.name for c in chain[:-1]], "options": options, "fields": [*fields.values()]}


def registrations(rel: str, method: str) -> dict[str, str]:
    """name -> "module:Class" of each literal `X.method(name, module, class)` call in a file."""
    mod, out = load(rel), {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Call) and call_name(node) == method and len(node.args) == 3:
            name, module, cls = (value(a, Ctx(mod)) for a in node.args)
            out[str(name)] = f"{module}:{cls}"
    return dict(sorted(out.items()))


def dict_reads(rel: str, receiver: str, within: ast.AST | None = None) -> Iterator[tuple[str, Any]]:
    """(key, facts) of each `r.get("key"[, default])`, `r.pop(...)`, `r["key"]` with r matching."""
    mod = load(rel)
    for node, stack in walk(within or mod.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            recv, key_e, dflt, how = node.value, node.slice, None, "[]"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            recv, key_e, how = node.func.value, node.args[0], node.func.attr
            dflt = node.args[1] if len(node.args) > 1 else None
        else:
            continue
        key = key_e.value if isinstance(key_e, ast.Constant) else None
        if how not in ("[]", "get", "pop") or not isinstance(key, str):
            continue
        if re.search(receiver, ast.unparse(recv)):
            facts = default_of(dflt, ctx_at(mod, stack), "required" if how == "[]" else "absent")
            yield key, {"file": rel, "read": f"{ast.unparse(recv)}.{how}"} | facts


def merge_reads(reads: Iterable[tuple[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """key -> its distinct reads, sorted."""
    out: dict[str, dict[str, Any]] = {}
    for key, facts in reads:
        out.setdefault(key, {})[json.dumps(facts, sort_keys=True)] = facts
    return {k: [v[s] for s in sorted(v)] for k, v in sorted(out.items())}


def init_keys(cls: ast.ClassDef, mod: Mod, skip: set[str]) -> dict[str, Any]:
    """Keyword parameters of a class's __init__ (minus skip) with their defaults."""
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    a, ctx = init.args, Ctx(mod, (assigns(cls.body),))
    pos = [*a.posonlyargs, *a.args]
    dflts = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    params = [*zip(pos, dflts, strict=True), *zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    keys = {
        p.arg: default_of(d, ctx, "required") for p, d in params if p.arg not in skip | {"self"}
    }
    return keys | ({"**kwargs": {"accepted": True}} if a.kwarg else {})


def tier_facts(target: str, fixed: set[str]) -> dict[str, Any]:
    """Constructor keys (with defaults) and config reads of one secondary tier class."""
    mod = load(module_rel(target.split(":")[0]))
    cls = mod.classes[target.split(":")[1]]
    keys, nested = init_keys(cls, mod, fixed), {}
    for node in ast.walk(cls):  # a key unpacked into a dataclass: Cls(**key)
        for kw in node.keywords if isinstance(node, ast.Call) else []:
            owner = find_class(call_name(node), mod)
            if kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id in keys and owner:
                where = f"{owner[1].rel}:{owner[0].name}"
                nested[kw.value.id] = {"class": where, **struct(owner[1], owner[0].name)}
    reads = merge_reads(dict_reads(mod.rel, r"(^|\.)\w*config$", cls))
    return {"class": target, "file": mod.rel, "keys": keys, "nested": nested, "config_reads": reads}


def offload_config() -> dict[str, Any]:
    """Keys that OffloadingConnector's specs and secondary tiers read from their config."""
    tiers = registrations(f"{KVO}/tiering/factory.py", "register_tier")
    tier_dirs = tuple(module_rel(t.split(":")[0]).rsplit("/", 1)[0] + "/" for t in tiers.values())
    paths = [*(SRC / KVO).rglob("*.py"), *(SRC / CONN / "v1").glob("offloading*/**/*.py")]
    paths.append(SRC / CONN / "v1" / "offloading_connector.py")
    rels = (str(p.relative_to(SRC)) for p in paths)
    files = sorted(r for r in rels if not r.startswith(tier_dirs))
    factory, bp = load(f"{KVO}/tiering/factory.py"), load(f"{KVO}/tiering/backpressure.py")
    make = next(n for n in ast.walk(factory.tree) if call_name(n) == "tier_cls")
    fixed = {k.arg for k in getattr(make, "keywords", []) if k.arg}
    top = (r for f in files for r in dict_reads(f, r"(^|\.)extra_config$"))
    tier_recv = r"^(tier_config|tier_cfg|config|bp_config)$"
    tier = (r for f in (factory.rel, f"{KVO}/tiering/spec.py") for r in dict_reads(f, tier_recv))
    detectors = [
        c for c in bp.classes.values() if any("Detector" in ast.unparse(b) for b in c.bases)
    ]
    return {
        "spec_names": registrations(f"{KVO}/factory.py", "register_spec"),
        "extra_config_keys": merge_reads(top),
        "files_scanned_for_extra_config": files,
        "tier_keys_read_by_factory_and_spec": merge_reads(tier),
        "tier_constructor_args_set_by_factory": sorted(fixed),
        "tier_types": {t: tier_facts(target, fixed) for t, target in tiers.items()},
        "backpressure_detectors": {c.name: init_keys(c, bp, {"policy"}) for c in detectors},
    }


def build() -> dict[str, Any]:
    """All facts, as written to the JSON file."""
    events, hits = load("vllm/distributed/kv_events.py"), load(HITS)
    in_vllm = ((p, p.relative_to(SRC)) for p in (SRC / "vllm").rglob("*.py"))
    files = sorted(
        str(rel)
        for path, rel in in_vllm
        if rel.parts[1] != "benchmarks" and SITE_TEXT_RE.search(path.read_text(errors="replace"))
    )
    families, unresolved = metrics(files)
    bucket_defaults = read(BUCKETS, "", "_STATIC_FAMILY_DEFAULTS") or {}
    waiting = [k for k in load(LOGGERS).consts if k.startswith("WAITING_REASON_")]
    hit_members = assigns(hits.classes["CacheHitSource"].body)
    structs = ["EventBatch", "KVEventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved"]
    return {
        "vllm_version": read("vllm/_version.py", "", "__version__"),
        "kv_events": {
            "structs": {n: struct(events, n) for n in [*structs, "AllBlocksCleared"]},
            "medium": {
                k: read(events.rel, "", k) for k in events.consts if k.startswith("MEDIUM_")
            },
        },
        "engine_labels": read(LOGGERS, "PrometheusStatLogger", "labelnames"),
        "metrics": families,
        "histogram_bucket_families": {
            k: bucket_defaults.get(k) for k in read(BUCKETS, "", "BucketFamilyKey") or []
        },
        "cache_hit_source": [
            {"name": k, "value": value(v[-1], Ctx(hits))} for k, v in hit_members.items()
        ],
        "waiting_reasons": [read(LOGGERS, "", k) for k in waiting],
        "kv_fetch_stages": read(STATS, "", "KV_FETCH_STAGES"),
        "label_values": {key: read(*where) for key, where in LABEL_VALUES.items()},
        "offload_config": offload_config(),
        "kv_connectors": registrations(f"{CONN}/factory.py", "register_connector"),
        "gaps": [*unresolved, *GAPS],
    }


def main() -> int:
    """Write the reference JSON, or with --check compare a file with the source."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--check", metavar="FILE")
    args = parser.parse_args()
    if not (SRC / "vllm/_version.py").is_file():
        sys.exit(f"{SRC}/vllm/_version.py not found: set VLLM_SRC to an unzipped vLLM wheel")
    facts = json.loads(json.dumps(build()))
    if args.check:
        old = json.loads(Path(args.check).read_text())
        changed = sorted(k for k in facts.keys() | old.keys() if facts.get(k) != old.get(k))
        new_m, old_m = ({m["name"]: m for m in d.get("metrics", [])} for d in (facts, old))
        both = new_m.keys() & old_m.keys()
        moved = sum(new_m[n] != old_m[n] for n in both)
        counts = f"+{len(new_m.keys() - both)} -{len(old_m.keys() - both)} ~{moved}"
        if changed:
            print(
                f"{args.check} differs from {SRC} in {', '.join(changed)}; metric families {counts}"
            )
        return 1 if changed else 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(facts['metrics'])} metric families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
