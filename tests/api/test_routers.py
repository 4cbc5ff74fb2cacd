"""Real routers in front of three `mocker serve` replicas.

vllm-router 0.1.17 (round_robin, cache_aware, power_of_two, kv_aware with KV events found
by discovery, no forwarder) and sglang-router 0.3.2 (cache_aware, power_of_two), each
installed in its own venv under .test-tools/ (skipped, loudly, when pip cannot fetch them).
Every run sends the same 200 requests (20 long shared prefixes x 10 short questions, the
same prefix recurring spread over time) and must have no failure, no 4xx/5xx in any
replica's access log (the routers' probes included), and no traceback. Prefix-aware
policies must hit the cache more than round_robin; power_of_two must see real loads.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.support.parsing import samples
from tests.support.servers import (
    AGNOSTIC,
    LoggedProcess,
    read_shared,
    served_url,
    stderr_of,
    wait_healthy,
)
from tests.support.tool_venv import tool_venv

REPLICAS = 3
DOCUMENTS = 20
QUESTIONS = 10
CONCURRENCY = 8
MAX_TOKENS = 8
MODEL = "mocker"

VLLM_ROUTER = ["vllm-router==0.1.17"]
SGLANG_ROUTER = ["sglang-router==0.3.2"]

RUNS = [
    ("vllm", "round_robin"),
    ("vllm", "cache_aware"),
    ("vllm", "power_of_two"),
    ("vllm", "kv_aware"),
    ("sglang", "cache_aware"),
    ("sglang", "power_of_two"),
]

# llm-d's topic: vllm-router's discovery subscribes to whatever topic /kv_event_sources names.
KV_EVENTS = json.dumps(
    {"enable_kv_cache_events": True, "publisher": "zmq",
     "endpoint": "tcp://127.0.0.1:*", "topic": "kv@{host}:{port}@{model}"}
)  # fmt: skip
REPLICA_ARGS = ("--speedup-ratio", "50", "--kv-events-config", KV_EVENTS)
# The two routers read /get_load differently (and send the same request): one flag per rig.
LOAD_FORMAT = {"vllm": "vllm-router", "sglang": "sglang"}

# uvicorn's access log line: `INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK`.
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


# -- replicas -----------------------------------------------------------------------------------


@dataclass
class Replica:
    proc: LoggedProcess
    url: str

    def log(self) -> str:
        return stderr_of(self.proc)


@contextmanager
def logged_replica(*args: str) -> Iterator[Replica]:
    """`python -m mocker serve --port 0 ARGS` with uvicorn's access log on.

    Like tests.support.servers.serve(), which turns the access log off: that log is the only
    place where mocker names each request's status, and the routers' own probes (/get_load,
    /get_server_info, ...) are requests a client never sees."""
    argv = [sys.executable, "-m", "mocker", "serve", "--port", "0", *AGNOSTIC, *args]
    with tempfile.TemporaryFile("w+") as log:
        # uvicorn writes its access log to stdout: into the same file, unbuffered.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = LoggedProcess(argv, log, stdout=log, env=env)
        try:
            url = served_url(proc)
            wait_healthy(proc, url)
            yield Replica(proc, url)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


class ReplicaSets:
    """Three replicas per router (started on first use, with that router's /get_load format),
    all stopped when the module's tests end."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._sets: dict[str, list[Replica]] = {}

    def get(self, router: str) -> list[Replica]:
        if router not in self._sets:
            args = (*REPLICA_ARGS, "--get-load-format", LOAD_FORMAT[router])
            self._sets[router] = [
                self._stack.enter_context(logged_replica(*args)) for _ in range(REPLICAS)
            ]
        return self._sets[router]


@pytest.fixture(scope="module")
def replicas() -> Iterator[ReplicaSets]:
    with ExitStack() as stack:
        yield ReplicaSets(stack)


# -- routers ------------------------------------------------------------------------------------


def router_argv(router: str, policy: str, port: int, urls: list[str], bin_dir: Path) -> list[str]:
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
              "--policy", policy,
              # Also the /get_load poll interval of power_of_two (default 30 s).
              "--worker-startup-check-interval", "1",
              # Both export metrics on 0.0.0.0:29000 unless told: a port of their own (a
              # taken one fails the start, which start_router retries with new ports).
              "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    if router == "vllm":
        return [str(bin_dir / "vllm-router"), *common]
    return [str(bin_dir / "python"), "-m", "sglang_router.launch_router", *common]


def free_port() -> int:
    """A port free right now. The router binds it itself, later: it may be gone by then,
    so start_router() tries again with another when the router fails to come up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _router_ready(proc: subprocess.Popen[str], url: str, workers: int, timeout: float) -> bool:
    """Whether the router answers /health and lists all `workers` in /get_loads in time
    (`workers` 0: /health alone, as in P/D mode, where /get_loads lists no workers)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                if not workers:
                    return True
                loads = httpx.get(url + "/get_loads", timeout=10).json()
                if len(loads.get("workers", [])) >= workers:
                    return True
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    return False


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Router:
    url: str
    output: IO[str]  # the router's stdout and stderr, a file open for reading

    def log(self) -> str:
        return ANSI.sub("", read_shared(self.output))  # (the router is still writing to it)


@contextmanager
def start_router(
    argv_for_port: Callable[[int], list[str]], workers: int, tries: int = 3
) -> Iterator[Router]:
    """Start a router on a free port (retrying with a new port if it does not come up), yield
    it, and always kill the process started (by its PID) afterwards."""
    outputs = []
    for _ in range(tries):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(
                argv_for_port(port), stdout=log, stderr=subprocess.STDOUT, text=True,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                if _router_ready(proc, url, workers, timeout=60):
                    yield Router(url, log)
                    return
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
                log.seek(0)
                outputs.append(ANSI.sub("", log.read()))
    tail = "\n".join(outputs[-1].splitlines()[-30:])
    raise AssertionError(f"router did not come up in {tries} tries: {argv_for_port(0)}\n{tail}")


# -- workload -----------------------------------------------------------------------------------

WORDS = [
    "river", "stone", "engine", "market", "garden", "letter", "silver", "window", "orange",
    "thunder", "harbor", "pencil", "lantern", "meadow", "copper", "violin", "island", "ladder",
    "summer", "candle", "forest", "rocket", "marble", "tiger", "canvas", "anchor", "valley",
    "mirror", "planet", "basket", "feather", "signal", "bridge", "cotton", "dragon", "falcon",
    "glacier", "hammer", "jungle", "kettle", "lemon", "magnet", "needle", "oyster", "pepper",
]  # fmt: skip


def workload() -> list[tuple[int, dict[str, Any]]]:
    """200 (document, request) pairs: question-major order, so each document's prefix comes
    back once every 20 requests (round robin spreads it over all replicas; a prefix-aware
    router keeps it on one). Every fifth request is a chat completion."""
    rng = random.Random(1234)
    docs = [
        f"Document {d}. " + " ".join(rng.choice(WORDS) for _ in range(320))
        for d in range(DOCUMENTS)
    ]
    out = []
    for q in range(QUESTIONS):
        for d, doc in enumerate(docs):
            question = f"Question {q}: how often does the word {WORDS[q]} appear above?"
            if (q + d) % 5 == 0:
                body = {"model": MODEL, "max_tokens": MAX_TOKENS,
                        "messages": [{"role": "system", "content": doc},
                                     {"role": "user", "content": question}]}  # fmt: skip
            else:
                body = {"model": MODEL, "max_tokens": MAX_TOKENS,
                        "prompt": f"{doc}\n\n{question}\nAnswer:"}  # fmt: skip
            out.append((d, body))
    return out


# -- one run ------------------------------------------------------------------------------------


@dataclass
class Run:
    router: str
    policy: str
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    hits: float = 0.0
    queries: float = 0.0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    per_replica: list[int] = field(default_factory=list)
    max_loads: dict[str, int] = field(default_factory=dict)  # from the router's /get_loads
    bad_statuses: list[str] = field(default_factory=list)  # replica access-log lines >= 400
    calls: Counter[str] = field(default_factory=Counter)  # replica access-log paths
    tracebacks: int = 0
    load_polls: int = 0
    router_log: str = ""
    workers: list[dict[str, Any]] = field(default_factory=list)  # sglang-router's GET /workers

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def _metric(text: str, name: str) -> float:
    return sum(samples(text, name).values())


def _scrape(replicas: list[Replica]) -> tuple[float, float]:
    hits = queries = 0.0
    for r in replicas:
        text = httpx.get(r.url + "/metrics", timeout=10).text
        hits += _metric(text, "vllm:prefix_cache_hits_total")
        queries += _metric(text, "vllm:prefix_cache_queries_total")
    return hits, queries


def _send(client: httpx.Client, base: str, body: dict[str, Any]) -> tuple[str | None, Any]:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    try:
        resp = client.post(base + path, json=body)
    except httpx.HTTPError as exc:
        return f"{path}: {type(exc).__name__}: {exc}", None
    if resp.status_code != 200:
        return f"{path}: {resp.status_code} {resp.text[:200]}", None
    try:
        return None, resp.json()
    except ValueError:
        return f"{path}: 200 with a body that is not JSON: {resp.text[:200]}", None


def _poll_loads(url: str, stop: threading.Event, run: Run) -> None:
    """The router's /get_loads (it asks each replica's /get_load there and then), as often as
    it answers while the requests run: the highest load seen per worker."""
    out = run.max_loads
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            try:
                for w in client.get(url + "/get_loads").json().get("workers", []):
                    out[w["worker"]] = max(out.get(w["worker"], -1), int(w["load"]))
                run.load_polls += 1
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                pass
            stop.wait(0.02)


def route(router: str, policy: str, bin_dir: Path, replicas: list[Replica]) -> Run:
    run = Run(router, policy)
    urls = [r.url for r in replicas]
    for r in replicas:  # every run starts cold
        httpx.post(r.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    marks = [len(r.log()) for r in replicas]
    hits0, queries0 = _scrape(replicas)
    served = {r.url: 0 for r in replicas}
    started = time.monotonic()
    with start_router(
        lambda port: router_argv(router, policy, port, urls, bin_dir), workers=len(urls)
    ) as proxy:
        base = proxy.url
        stop = threading.Event()
        poller = threading.Thread(target=_poll_loads, args=(base, stop, run))
        poller.start()
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client,
                ThreadPoolExecutor(CONCURRENCY) as pool,
            ):
                jobs = [pool.submit(_send, client, base, body) for _, body in workload()]
                for job in jobs:
                    error, answer = job.result(timeout=300)
                    if error:
                        run.failures.append(error)
                        continue
                    usage = answer.get("usage") or {}
                    run.prompt_tokens += usage.get("prompt_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    run.cached_tokens += details.get("cached_tokens") or 0
        finally:
            stop.set()
            poller.join(timeout=30)
        if router == "sglang":  # what its registration learned of each worker
            run.workers = httpx.get(base + "/workers", timeout=30).json()["workers"]
        run.router_log = proxy.log()
    run.seconds = time.monotonic() - started
    hits1, queries1 = _scrape(replicas)
    run.hits, run.queries = hits1 - hits0, queries1 - queries0
    for r, mark in zip(replicas, marks, strict=True):
        text = r.log()[mark:]
        run.tracebacks += text.count("Traceback")
        for line in text.splitlines():
            m = ACCESS.search(line)
            if not m:
                continue
            path = m["path"].split("?")[0]
            run.calls[f"{m['method']} {path}"] += 1
            if m["method"] == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                served[r.url] += 1
            if int(m["status"]) >= 400:
                run.bad_statuses.append(f"{r.url} {m['method']} {path} {m['status']}")
    run.per_replica = list(served.values())
    return run


# -- the runs, shared by the tests --------------------------------------------------------------


class Runs:
    """Each (router, policy) run once per module, on demand, with a table at the end."""

    def __init__(self, replicas: ReplicaSets) -> None:
        self.replicas = replicas
        self.done: dict[tuple[str, str], Run] = {}
        self.bins: dict[str, Path] = {}

    def bin_dir(self, router: str) -> Path:
        if router not in self.bins:
            requirements = VLLM_ROUTER if router == "vllm" else SGLANG_ROUTER
            self.bins[router] = tool_venv(f"{router}-router", requirements)
        return self.bins[router]

    def get(self, router: str, policy: str) -> Run:
        key = (router, policy)
        if key not in self.done:
            bin_dir = self.bin_dir(router)
            self.done[key] = route(router, policy, bin_dir, self.replicas.get(router))
        return self.done[key]

    def table(self) -> str:
        rows = [
            f"{'router':8} {'policy':13} {'hit rate':>8} {'cached/prompt':>13} {'s':>6} "
            f"{'fail':>4} {'4xx/5xx':>7} {'per replica':>14}  max router loads"
        ]
        for run in self.done.values():
            cached = run.cached_tokens / run.prompt_tokens if run.prompt_tokens else 0.0
            rows.append(
                f"{run.router:8} {run.policy:13} {run.hit_rate:8.3f} {cached:13.3f} "
                f"{run.seconds:6.1f} {len(run.failures):4} {len(run.bad_statuses):7} "
                f"{'/'.join(map(str, run.per_replica)):>14}  "
                f"{sorted(run.max_loads.values()) if run.max_loads else '-'} "
                f"({run.load_polls} polls)"
            )
        rows.append("replica calls other than completions, /metrics, /reset_prefix_cache:")
        quiet = {"POST /v1/completions", "POST /v1/chat/completions", "GET /metrics",
                 "POST /reset_prefix_cache"}  # fmt: skip
        for run in self.done.values():
            other = {k: v for k, v in sorted(run.calls.items()) if k not in quiet}
            rows.append(f"  {run.router} {run.policy}: {other}")
        return "\n".join(rows)


@pytest.fixture(scope="module")
def runs(replicas: ReplicaSets) -> Iterator[Runs]:
    all_runs = Runs(replicas)
    yield all_runs
    if all_runs.done:
        print("\n" + all_runs.table())


# -- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("router", "policy"), RUNS, ids=[f"{r}-{p}" for r, p in RUNS])
def test_route_without_errors(runs: Runs, router: str, policy: str) -> None:
    run = runs.get(router, policy)
    total = DOCUMENTS * QUESTIONS
    assert not run.failures, f"{len(run.failures)}/{total} failed, e.g. {run.failures[:3]}"
    assert sum(run.per_replica) == total, (run.per_replica, run.calls)  # the access log works
    bad = Counter(line.split(" ", 1)[1] for line in run.bad_statuses)
    assert not bad, f"replicas logged 4xx/5xx during the run: {dict(bad)}"
    assert run.tracebacks == 0, "a replica logged a traceback"


def test_prefix_aware_policies_hit_more_than_round_robin(runs: Runs) -> None:
    baseline = runs.get("vllm", "round_robin")
    contenders = [runs.get("vllm", "kv_aware"), runs.get("vllm", "cache_aware"),
                  runs.get("sglang", "cache_aware")]  # fmt: skip
    assert baseline.queries > 0, "no prefix-cache queries counted in /metrics"
    beaten = [f"{r.router} {r.policy}: {r.hit_rate:.3f}" for r in contenders
              if r.hit_rate <= baseline.hit_rate]  # fmt: skip
    assert not beaten, f"not above round_robin's {baseline.hit_rate:.3f}: {beaten}\n{runs.table()}"


@pytest.mark.parametrize("router", ["vllm", "sglang"])
def test_power_of_two_sees_real_loads(runs: Runs, router: str) -> None:
    run = runs.get(router, "power_of_two")
    get_load = sum(n for call, n in run.calls.items() if call == "GET /get_load")
    assert get_load > 0, f"the router never called the replicas' /get_load: {dict(run.calls)}"
    loads = dict(run.max_loads)
    top = max(loads.values(), default=-1)
    assert top > 0, (
        f"{router}-router's /get_loads never showed a load above 0 during the run "
        f"(-1: it could not read the replica's /get_load): {loads}"
    )


def test_kv_aware_subscribes_to_every_replica(runs: Runs) -> None:
    """vllm-router's kv_aware found each replica's KV-event publisher by itself (GET
    /get_server_info and /kv_event_sources) and subscribed to it: no forwarder, no flags."""
    run = runs.get("vllm", "kv_aware")
    kv_lines = [line for line in run.router_log.splitlines() if "kv_index" in line]
    missing = [r.url for r in runs.replicas.get("vllm")
               if f"kv_index {r.url}: spawned subscriber" not in run.router_log]  # fmt: skip
    assert not missing, f"no KV-event subscriber for {missing}:\n" + "\n".join(kv_lines[-20:])


def test_sglang_router_registers_each_replica_with_its_model(runs: Runs) -> None:
    """sglang-router read GET /server_info and /model_info at registration: the served model
    (not "unknown"), its data-parallel size and architecture."""
    run = runs.get("sglang", "cache_aware")
    assert sorted(w["url"] for w in run.workers) == sorted(
        r.url for r in runs.replicas.get("sglang")
    )
    for worker in run.workers:
        assert worker["model_id"] == MODEL and worker["is_healthy"], worker
        meta = worker["metadata"]
        assert (meta["served_model_name"], meta["dp_size"], meta["model_type"]) == (
            MODEL,
            "1",
            "llama",
        ), meta
