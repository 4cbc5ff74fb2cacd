"""KV events from `mocker serve` as a router sees them: a real uvicorn, the `openai` client, real
ZMQ sockets. A router index built from the live stream predicts every `cached_tokens`; a late
joiner converges through replay; a prefix-cache reset is announced and true."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mocker.kvevents.config import KVEventsConfig
from tests.support.kv_consumer import Received, Subscriber, replay
from tests.support.kv_index import EventIndex
from tests.support.servers import ServerThread, make_app, settings

BLOCK = 16


class Follower:
    """A router's consumer: applies batches strictly in sequence order, from live SUB
    messages, or from replay for any it missed (the PUB drops what it sent before the
    subscription arrived)."""

    def __init__(self, sub: Subscriber, replay_url: str) -> None:
        self.sub = sub
        self.replay_url = replay_url
        self.index = EventIndex(BLOCK)
        self.applied = -1
        self.replayed = 0  # replay requests made
        self._fetched: dict[int, Received] = {}  # replayed batches not applied yet

    def catch_up(self, last_seq: int) -> None:
        """Apply every batch up to and including `last_seq`."""
        start = time.monotonic()
        deadline = start + 10
        while self.applied < last_seq:
            live = {m.seq: m for m in self.sub.messages() if m.seq > self.applied}
            nxt = live.get(self.applied + 1) or self._fetched.pop(self.applied + 1, None)
            if nxt is None and (live or time.monotonic() - start > 0.5):
                # A gap (or nothing for a while): the batch went out before we subscribed.
                self._fetched = {m.seq: m for m in replay(self.replay_url, self.applied + 1)}
                self.replayed += 1
                nxt = self._fetched.pop(self.applied + 1, None)
            if nxt is None:
                assert time.monotonic() < deadline, f"batch {self.applied + 1} never arrived"
                time.sleep(0.005)
                continue
            self._apply(nxt)

    def _apply(self, m: Received) -> None:
        assert m.seq == self.applied + 1
        assert m.batch.data_parallel_rank == 0
        self.index.apply(m.batch.events)
        self.applied = m.seq


@pytest.fixture(scope="module")
def events_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, str]]:
    # Bound on an ipc path (local, and bound by vLLM's rule, so several subscribers can join);
    # the replay ROUTER on loopback TCP, on a port the system picks (read back from the
    # publisher). A small pool, so prompts evict each other.
    folder = tmp_path_factory.mktemp("kv")
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"ipc://{folder}/events",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv@{host}:{port}@{model}",
    )
    app = make_app(
        settings(kv_events=config, port=8123, served_model_names=("routed",)),
        block_size=BLOCK,
        num_gpu_blocks=96,
        max_model_len=1024,
        speedup_ratio=200.0,
    )
    with ServerThread(app) as srv:
        replay_url = srv.app.state.mocker.publishers[0].replay_endpoint
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", replay_url), replay_url
        yield srv, replay_url


def sources(url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(url + "/kv_event_sources", timeout=10).json()
    return data


def last_seq(url: str) -> int:
    seq: int = sources(url)["0"]["next_seq"]
    return seq - 1


def engine_cache(srv: ServerThread) -> set[int]:
    # Read while the engine is idle (every request above has completed).
    return set(srv.app.state.mocker.engines[0].core.pool.cached_hashes())


def test_kv_event_sources_says_where_to_connect(events_server: tuple[ServerThread, str]) -> None:
    srv, replay_url = events_server
    body = sources(srv.url)
    (rank,) = body  # vLLM's shape: one entry per data-parallel rank
    source = body[rank]
    assert rank == "0" and source["format"] == "map"
    assert source["model"] == "routed" and source["block_size"] == BLOCK
    # vLLM's KVEventsConfig fields, and what vllm-router's discovery also requires
    assert source["enable_kv_cache_events"] is True and source["publisher"] == "zmq"
    assert source["encoding"] == "msgpack" and source["schema_version"] == 1
    assert (source["buffer_steps"], source["hwm"], source["max_queue_size"]) == (
        10_000,
        100_000,
        100_000,
    )
    assert source["mode"] == "bind" and source["connect"] == source["endpoint"]
    assert source["endpoint"].startswith("ipc://")
    assert source["replay_endpoint"] == source["replay_connect"] == replay_url
    assert source["topic"] == "kv@127.0.0.1:8123@routed"  # llm-d's kv@<ip>:<port>@<model>
    assert source["data_parallel_rank"] == 0 and source["next_seq"] >= 1


def test_router_index_predicts_cached_tokens(events_server: tuple[ServerThread, str]) -> None:
    srv, replay_url = events_server
    endpoint = sources(srv.url)["0"]["connect"]
    sub = Subscriber(endpoint)
    follower = Follower(sub, replay_url)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    rng = random.Random(7)
    prefixes = [[rng.randrange(100, 90000) for _ in range(rng.choice([40, 200, 333]))]
                for _ in range(5)]  # fmt: skip
    outcomes = {"full": 0, "partial": 0, "miss": 0}
    try:
        for i in range(60):
            prompt = rng.choice(prefixes)[: rng.randint(1, 333)]
            prompt = prompt + [rng.randrange(100, 90000) for _ in range(rng.randint(0, 40))]
            if not prompt:
                continue
            follower.catch_up(last_seq(srv.url))
            predicted = follower.index.predict_cached_tokens(prompt)
            completion = client.completions.create(
                model="routed", prompt=prompt, max_tokens=rng.randint(1, 40)
            )
            usage = completion.usage
            assert usage is not None and usage.prompt_tokens_details is not None
            assert usage.prompt_tokens_details.cached_tokens == predicted, (i, len(prompt))
            full = (len(prompt) - 1) // BLOCK * BLOCK
            outcomes["full" if predicted == full > 0 else "partial" if predicted else "miss"] += 1
        follower.catch_up(last_seq(srv.url))
        assert follower.index.hashes("GPU") == engine_cache(srv)
    finally:
        sub.close()
    # Hits of every kind happened, and the pool (96 blocks) evicted.
    assert all(outcomes.values()), outcomes
    assert follower.index.counts["BlockRemoved"] > 0


def test_late_joiner_converges_through_replay(events_server: tuple[ServerThread, str]) -> None:
    srv, replay_url = events_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    for n in (50, 120):
        client.completions.create(model="routed", prompt=list(range(1000, 1000 + n)), max_tokens=20)
    # Joins late: subscribe first, then replay from 0, then live batches after the replay.
    endpoint = sources(srv.url)["0"]["connect"]
    sub = Subscriber(endpoint)
    try:
        replayed = replay(replay_url, 0)  # returns only once the end marker arrived
        assert [m.seq for m in replayed] == list(range(len(replayed)))  # from 0, no gaps
        assert type(replayed[0].batch.events[0]).__name__ == "AllBlocksCleared"
        late = Follower(sub, replay_url)
        for m in replayed:
            late._apply(m)
        client.completions.create(model="routed", prompt=list(range(5000, 5100)), max_tokens=5)
        late.catch_up(last_seq(srv.url))
        assert late.index.hashes("GPU") == engine_cache(srv)
        assert late.index.hashes("GPU")  # something is cached to agree on
    finally:
        sub.close()


def test_reset_prefix_cache_is_announced(events_server: tuple[ServerThread, str]) -> None:
    srv, replay_url = events_server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    prompt = list(range(7000, 7100))
    client.completions.create(model="routed", prompt=prompt, max_tokens=2)
    follower = Follower(Subscriber(sources(srv.url)["0"]["connect"]), replay_url)
    try:
        follower.catch_up(last_seq(srv.url))  # all of it, through replay
        assert follower.index.predict_cached_tokens(prompt) == 96
        r = httpx.post(srv.url + "/reset_prefix_cache", timeout=10)
        assert r.status_code == 200 and r.json()["cleared_blocks"] > 0
        assert r.json()["success"] is True  # (vLLM 0.34's answer; nothing was running)
        follower.catch_up(last_seq(srv.url))
        assert follower.index.counts["AllBlocksCleared"] >= 2  # start-up, then the reset
        assert follower.index.hashes("GPU") == engine_cache(srv) == set()
        again = client.completions.create(model="routed", prompt=prompt, max_tokens=2)
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == 0
    finally:
        follower.sub.close()


def test_without_events_sources_say_so_and_reset_still_works(server: ServerThread) -> None:
    assert sources(server.url) == {}  # as vLLM: no rank publishes
    r = httpx.post(server.url + "/reset_prefix_cache", timeout=10)
    assert r.status_code == 200 and "cleared_blocks" in r.json()


def test_events_disabled_publishes_nothing_and_binds_nothing(tmp_path: Path) -> None:
    config = KVEventsConfig(enable_kv_cache_events=False, endpoint=f"ipc://{tmp_path}/never")
    app = make_app(settings(kv_events=config))
    state = app.state.mocker
    assert state.publishers == [] and not state.config.cache.enable_kv_cache_events
    assert not (tmp_path / "never").exists()


def stored_events(replay_url: str, expect: Callable[[list[Any]], bool]) -> list[Any]:
    """Every BlockStored the replay buffer holds once `expect` holds of them (the sender
    thread publishes a pass's batch after its tokens are out): polled up to a deadline."""
    deadline = time.monotonic() + 10
    while True:
        stored = [e for m in replay(replay_url, 0) for e in m.batch.events
                  if type(e).__name__ == "BlockStored"]  # fmt: skip
        if expect(stored) or time.monotonic() > deadline:
            return stored
        time.sleep(0.05)


def test_stored_blocks_name_the_requests_session(events_server: tuple[ServerThread, str]) -> None:
    # vLLM 0.34: the body's session_id, else X-Session-ID, else vllm_xargs.session_id.
    srv, replay_url = events_server
    sub = Subscriber(sources(srv.url)["0"]["connect"])  # (the publisher waits for one)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    asks: list[tuple[int, dict[str, Any], dict[str, Any]]] = [
        (11000, {"session_id": "body"}, {"X-Session-ID": "header"}),
        (12000, {}, {"X-Session-ID": "header"}),
        (13000, {"vllm_xargs": {"session_id": "xarg"}}, {}),
        (14000, {}, {}),
    ]
    for start, body, headers in asks:
        client.completions.create(model="routed", prompt=list(range(start, start + 40)),
                                  max_tokens=2, extra_body=body, extra_headers=headers)  # fmt: skip
    chat = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
        "model": "routed", "max_tokens": 2, "session_id": "chat",
        "messages": [{"role": "user", "content": "a conversation " * 30}]})  # fmt: skip
    assert chat.status_code == 200, chat.text
    stored = stored_events(replay_url, lambda got: any(e.session_id == "chat" for e in got))
    sub.close()
    client.close()
    sessions: dict[int, set[str | None]] = {}
    for event in stored:
        if event.medium == "GPU":
            assert (event.group_idx, event.kv_cache_spec_kind) == (0, "full_attention")
            sessions.setdefault(event.token_ids[0], set()).add(event.session_id)
    found = {start: sessions.get(start) for start, _, _ in asks}
    assert found == {11000: {"body"}, 12000: {"header"}, 13000: {"xarg"}, 14000: {None}}
    assert {"chat"} in sessions.values()


def test_vllm_compat_033_serves_033s_forms(tmp_path: Path) -> None:
    # --vllm-compat 0.33: a dense model's events without group fields, and the cache-source
    # counter with 0.33's labels (the device only, with no tier); 0.34's lists all five.
    events = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"ipc://{tmp_path}/ev",
                            replay_endpoint="tcp://127.0.0.1:*")  # fmt: skip
    for release in ("0.33", "0.34"):
        app = make_app(settings(kv_events=events, vllm_compat=release), block_size=BLOCK)
        with ServerThread(app) as srv:
            source = sources(srv.url)["0"]
            sub = Subscriber(source["connect"])
            try:
                client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
                client.completions.create(model="mocker", prompt=list(range(100, 140)),
                                          max_tokens=2)  # fmt: skip
                client.close()
                stored = stored_events(source["replay_connect"], bool)
            finally:
                sub.close()
            metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        labels = set(re.findall(r'prompt_tokens_cached_by_source_total\{[^}]*source="(\w+)"',
                                metrics))  # fmt: skip
        assert stored
        if release == "0.33":
            assert all(e.group_idx is None and e.kv_cache_spec_kind is None for e in stored)
            assert labels == {"device"}
        else:
            assert all(e.group_idx == 0 for e in stored)
            assert labels == {"device", "host", "p2p", "disk", "external_unspecified"}


def test_full_report_mode_announces_the_blocks_a_request_hits(
    events_server: tuple[ServerThread, str],
) -> None:
    # vLLM 0.34's vllm_xargs.kv_cache_report_mode "full": a request that hits the prefix
    # cache publishes a BlockStored for the blocks it reused (from block 0, no parent, with
    # its session), so a gateway learns what each request found.
    srv, replay_url = events_server
    sub = Subscriber(sources(srv.url)["0"]["connect"])
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    prompt = list(range(21000, 21070))  # 4 full blocks of 16 (and 6 tokens)
    client.completions.create(model="routed", prompt=prompt, max_tokens=1)
    again = client.completions.create(model="routed", prompt=prompt, max_tokens=1, extra_body={
        "vllm_xargs": {"kv_cache_report_mode": "full", "session_id": "reader"}})  # fmt: skip
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 64
    stored = stored_events(replay_url, lambda got: any(e.session_id == "reader" for e in got))
    sub.close()
    client.close()
    first = [e for e in stored if e.token_ids[:1] == [21000] and e.session_id is None]
    (announced,) = [e for e in stored if e.session_id == "reader"]
    assert announced.parent_block_hash is None and announced.token_ids == prompt[:64]
    assert announced.block_hashes == [h for e in first for h in e.block_hashes][:4]
    assert (announced.group_idx, announced.kv_cache_spec_kind) == (0, "full_attention")


def test_full_hash_mode_publishes_vllms_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 with vLLM's sha256_cbor: a router that hashes the
    # token ids itself (vLLM's digests, computed by vLLM's own code) finds them on the wire.
    cases = json.loads((Path(__file__).parent.parent / "kv" / "data"
                        / "vllm_0.33.0_block_hashes.json").read_text())["cases"]  # fmt: skip
    case = next(c for c in cases if (c["algo"], c["pythonhashseed"], c["prompt"])
                == ("sha256_cbor", "0", "A"))  # fmt: skip
    digests = [bytes.fromhex(h) for h in case["block_hashes_hex"]]
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    events = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"ipc://{tmp_path}/ev",
                            replay_endpoint="tcp://127.0.0.1:*")  # fmt: skip
    app = make_app(settings(kv_events=events), block_size=BLOCK, num_gpu_blocks=64,
                   max_model_len=512, prefix_caching_hash_algo="sha256_cbor",
                   int_block_hashes=False)  # fmt: skip
    with ServerThread(app) as srv:
        source = sources(srv.url)["0"]
        sub = Subscriber(source["connect"])
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        try:
            client.completions.create(model="mocker", prompt=case["token_ids"], max_tokens=1)
            assert httpx.post(srv.url + "/reset_prefix_cache", timeout=10).status_code == 200
            deadline = time.monotonic() + 10
            while True:
                got = [e for m in replay(source["replay_endpoint"], 0) for e in m.batch.events]
                if any(type(e).__name__ == "AllBlocksCleared" for e in got[1:]):
                    break
                assert time.monotonic() < deadline, "the reset was never published"
                time.sleep(0.05)
        finally:
            sub.close()
            client.close()
    stored = [h for e in got if type(e).__name__ == "BlockStored" for h in e.block_hashes]
    assert stored[: len(digests)] == digests
    assert all(isinstance(h, bytes) and len(h) == 32 for h in stored)
