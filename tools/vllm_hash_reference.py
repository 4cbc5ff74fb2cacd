#!/usr/bin/env python3
"""Reference prefix-cache block hashes computed with vLLM's own code (the raw data behind
tests/kv/data/vllm_0.33.0_block_hashes.json, which keeps the fields the tests read).

Usage (a venv with cbor2, xxhash and msgspec; no torch needed):
    pip download --no-deps vllm==0.33.0 -d wheels && unzip -q wheels/vllm-*.whl -d src
    VLLM_SRC=src python tools/vllm_hash_reference.py OUT.json   # driver: all seeds
    PYTHONHASHSEED=0 VLLM_SRC=src python tools/vllm_hash_reference.py --worker  # one seed

With the wheel unzipped at $VLLM_SRC:
  * vllm/utils/hashing.py, vllm/envs.py and vllm/lora/request.py are imported
    as-is by file path (they only need stdlib + cbor2 / xxhash / msgspec);
  * from vllm/v1/core/kv_cache_utils.py (whose module imports need torch) the
    needed top-level functions/constants are extracted VERBATIM via `ast` and
    exec'd in a namespace that stubs only the unused imports (logger,
    get_mm_features_in_window, tensor_data).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import types

SRC = os.environ.get("VLLM_SRC", "src")
KVU = f"{SRC}/vllm/v1/core/kv_cache_utils.py"
HASHING = f"{SRC}/vllm/utils/hashing.py"
ENVS = f"{SRC}/vllm/envs.py"
LORA_REQ = f"{SRC}/vllm/lora/request.py"
BLOCK_SIZE = 16
ALGOS = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]  # PrefixCachingHashAlgo
SEEDS = ["0", "12345", None]  # None = PYTHONHASHSEED unset
LORA_NAME = "sql-lora"
LORA_INT_ID = 1
LORA_PATHS = ["/adapters/sql-lora", "sql-lora"]


def load_by_path(modname, path):
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


KVU_NAMES = [
    "BlockHash",
    "ExternalBlockHash",
    "maybe_convert_block_hash",
    "DEFAULT_NONE_HASH_SEED",
    "_NON_CRYPTO_HASH_FUNCTIONS",
    "_NONE_HASH_SEED",
    "resolve_none_hash_seed",
    "get_none_hash_seed",
    "init_none_hash",
    "_gen_mm_extra_hash_keys",
    "_gen_lora_extra_hash_keys",
    "_gen_prompt_embeds_extra_hash_keys",
    "generate_block_hash_extra_keys",
    "to_event_extra_keys",
    "hash_block_tokens",
    "get_request_block_hasher",
]


def load_kv_cache_utils():
    hashing = load_by_path("vllm.utils.hashing", HASHING)
    envs = load_by_path("vllm.envs", ENVS)
    with open(KVU) as f:
        src = f.read()
    tree = ast.parse(src)
    picked = []
    for node in tree.body:
        names = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        if any(n in KVU_NAMES for n in names):
            picked.append(node)
    found = set()
    for n in picked:
        found.add(
            getattr(n, "name", None)
            or (n.targets[0].id if isinstance(n, ast.Assign) else n.target.id)
        )
    missing = set(KVU_NAMES) - found
    assert not missing, missing
    mod = types.ModuleType("kv_cache_utils_extract")
    ns = mod.__dict__
    import hashlib
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, NewType, TypeAlias

    class _Logger:
        def warning(self, *a, **k):
            print("[vllm logger.warning] " + (a[0] % a[1:]), file=sys.stderr)

        debug = info = warning

    def _unused(*a, **k):
        raise RuntimeError("not used for text-only requests")

    ns.update(
        dict(
            os=os,
            hashlib=hashlib,
            Callable=Callable,
            Iterable=Iterable,
            Sequence=Sequence,
            Any=Any,
            NewType=NewType,
            TypeAlias=TypeAlias,
            envs=envs,
            xxhash=hashing.xxhash,
            xxhash_cbor=hashing.xxhash_cbor,
            logger=_Logger(),
            get_mm_features_in_window=_unused,
            tensor_data=_unused,
            Request=object,
        )
    )
    code = compile(ast.Module(body=picked, type_ignores=[]), KVU, "exec")
    exec(code, ns)
    return hashing, envs, mod


class FakeRequest:
    """Only the attributes the block hasher / extra-key code reads."""

    def __init__(self, token_ids, lora_request=None, cache_salt=None):
        self.all_token_ids = list(token_ids)
        self.num_tokens = len(token_ids)
        self.block_hashes = []
        self.mm_features = []
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}


def worker():
    import pickle

    import cbor2

    hashing, envs, kvu = load_kv_cache_utils()
    lora_mod = load_by_path("vllm.lora.request", LORA_REQ)
    seed = os.environ.get("PYTHONHASHSEED")
    out = []
    prompts = [("A", list(range(1, 49)), None, None), ("B", [7] * 32, None, None)]

    # NB pickle memoizes by object identity: if lora_name and lora_path are the SAME str
    # object, pickle emits a memo reference (BINGET) instead of the string again and the
    # hash changes. In a real server name/path are parsed separately (distinct objects), so
    # we build distinct str objects here; "C_path_eq_name_same_obj" shows the identity case.
    def fresh(x):
        return "".join(list(x))

    variants = [
        ("C", fresh(LORA_NAME), fresh(LORA_PATHS[0])),
        ("C_path_eq_name", fresh(LORA_NAME), fresh(LORA_PATHS[1])),
        ("C_path_eq_name_same_obj", LORA_NAME, LORA_NAME),
    ]
    for tag, nm, p in variants:
        if tag.endswith("same_obj"):
            assert nm is p
        else:
            assert nm is not p or nm != p
        prompts.append(
            (
                tag,
                list(range(1000, 1016)),
                lora_mod.LoRARequest(lora_name=nm, lora_int_id=LORA_INT_ID, lora_path=p),
                None,
            )
        )
    prompts.append(("D", list(range(1, 33)), None, "salt-1"))
    # E: LoRA + cache_salt together (order: lora keys, mm keys, cache_salt, prompt_embeds)
    prompts.append(
        (
            "E",
            list(range(1, 33)),
            lora_mod.LoRARequest(
                lora_name=fresh(LORA_NAME), lora_int_id=LORA_INT_ID, lora_path=fresh(LORA_PATHS[0])
            ),
            "salt-1",
        )
    )
    for algo in ALGOS:
        hash_fn = hashing.get_hash_fn_by_name(algo)
        kvu.init_none_hash(hash_fn)
        none_hash = kvu.NONE_HASH
        for name, toks, lora, salt in prompts:
            req = FakeRequest(toks, lora, salt)
            hasher = kvu.get_request_block_hasher(BLOCK_SIZE, hash_fn, 0)
            hashes = hasher(req)
            req.block_hashes.extend(hashes)
            # cross-check: direct hash_block_tokens chain gives identical result
            extra_per_block, chain, parent, ser_inputs = [], [], None, []
            mm_idx = 0
            for i in range(len(toks) // BLOCK_SIZE):
                s, e = i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE
                ek, mm_idx = kvu.generate_block_hash_extra_keys(req, s, e, mm_idx)
                extra_per_block.append(ek)
                h = kvu.hash_block_tokens(hash_fn, parent, toks[s:e], ek)
                obj = (parent if parent else none_hash, tuple(toks[s:e]), ek)
                if "cbor" in algo:
                    ser_inputs.append(cbor2.dumps(obj, canonical=True).hex())
                else:
                    ser_inputs.append(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL).hex())
                chain.append(h)
                parent = h
            assert chain == hashes, (algo, name)
            ev = [kvu.maybe_convert_block_hash(h) for h in hashes]
            out.append(
                dict(
                    algo=algo,
                    pythonhashseed=seed,
                    none_hash_seed_used=kvu.get_none_hash_seed(),
                    prompt=name,
                    token_ids=toks,
                    lora_request=None
                    if lora is None
                    else dict(
                        lora_name=lora.lora_name,
                        lora_int_id=lora.lora_int_id,
                        lora_path=lora.lora_path,
                        name_and_path_same_object=lora.lora_name is lora.lora_path,
                    ),
                    cache_salt=salt,
                    extra_keys_per_block=[
                        None if k is None else [list(x) for x in k] for k in extra_per_block
                    ],
                    extra_keys_per_block_repr=[repr(k) for k in extra_per_block],
                    event_extra_keys=[
                        None if k is None else list(k)
                        for k in (kvu.to_event_extra_keys(extra_per_block) or [])
                    ]
                    or None,
                    event_lora_id=lora.adapter_id if lora else None,
                    event_lora_name=lora.name if lora else None,
                    none_hash_hex=none_hash.hex(),
                    block_hashes_hex=[h.hex() for h in hashes],
                    block_hash_type=type(hashes[0]).__name__,
                    block_hash_len=len(hashes[0]),
                    event_hashes_int=ev,
                    event_parent_block_hash_first_event=None,
                    event_parent_hashes_int_per_block=[None, *ev[:-1]],
                    serialized_hash_inputs_hex=ser_inputs,
                    none_hash_serialized_input_hex=(
                        cbor2.dumps(kvu.get_none_hash_seed(), canonical=True).hex()
                        if "cbor" in algo
                        else pickle.dumps(
                            kvu.get_none_hash_seed(), protocol=pickle.HIGHEST_PROTOCOL
                        ).hex()
                    ),
                    use_int_block_hashes_env=envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES,
                    random_none_hash=(seed is None and "xxhash" in algo),
                )
            )
    json.dump(out, sys.stdout)


def driver():
    cases = []
    for seed in SEEDS:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONHASHSEED", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES")
        }
        if seed is not None:
            env["PYTHONHASHSEED"] = seed
        r = subprocess.run(
            [sys.executable, __file__, "--worker"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        cases.extend(json.loads(r.stdout))
    # demonstrate randomness of unset-seed xxhash NONE_HASH: second unset run
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    r2 = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--worker"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    first = {
        (c["algo"], c["prompt"]): c["none_hash_hex"] for c in cases if c["pythonhashseed"] is None
    }
    unset_repro = {
        a: first[(a, "A")]
        == next(c["none_hash_hex"] for c in r2 if c["algo"] == a and c["prompt"] == "A")
        for a in ALGOS
    }
    ref = dict(
        vllm_version="0.33.0",
        source_files=[
            "vllm/utils/hashing.py (sha256, sha256_cbor, xxhash, xxhash_cbor, get_hash_fn_by_name)",
            "vllm/v1/core/kv_cache_utils.py (NONE_HASH, resolve_none_hash_seed, init_none_hash, "
            "hash_block_tokens, generate_block_hash_extra_keys, _gen_lora_extra_hash_keys, "
            "to_event_extra_keys, maybe_convert_block_hash, get_request_block_hasher)",
            "vllm/config/cache.py (PrefixCachingHashAlgo, prefix_caching_hash_algo default "
            "'sha256')",
            "vllm/envs.py (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES default '1')",
            "vllm/v1/core/block_pool.py (BlockStored emission, parent_block_hash)",
            "vllm/distributed/kv_events.py (BlockStored fields)",
            "vllm/lora/request.py (LoRARequest)",
        ],
        block_size=BLOCK_SIZE,
        algos=ALGOS,
        default_algo="sha256",
        unset_seed_none_hash_reproducible_across_processes=unset_repro,
        notes="pythonhashseed null = env var unset; for xxhash/xxhash_cbor with null seed the "
        "NONE_HASH (and all block hashes) are random per process (values here are one sample, "
        "flag random_none_hash=true). extra_keys_per_block lists tuples as JSON arrays; "
        "the exact Python repr is in extra_keys_per_block_repr.",
        cases=cases,
    )
    with open(sys.argv[1] if len(sys.argv) > 1 else "vllm_hash_reference.json", "w") as f:
        json.dump(ref, f, indent=1)
    print("wrote", len(cases), "cases; unset-seed reproducible:", unset_repro)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        driver()
