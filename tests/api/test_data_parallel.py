"""`--data-parallel-size K` over HTTP: K engines behind one server, each with its own KV cache,
`engine` metric label and KV-event port; least-loaded spread and rank pinning."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import zmq

from mocker.kvevents.config import KVEventsConfig, connectable
from tests.support.engines import req
from tests.support.kv_consumer import Subscriber, replay
from tests.support.parsing import samples
from tests.support.servers import AppClient, ServerThread, make_app, settings

BLOCK = 16


def subscribers_on_consecutive_ports(n: int) -> list[Subscriber]:
    """n bound subscribers on loopback ports P, P + 1, ... (rank r's engine dials port + r):
    P is the system's pick; each next port is bound at once, and the whole run is tried
    again elsewhere if one is taken. No port is chosen first and bound later."""
    for _ in range(50):
        subs = [Subscriber("tcp://127.0.0.1:*", bind=True)]
        port = int(subs[0].endpoint.rpartition(":")[2])
        try:
            for r in range(1, n):
                subs.append(Subscriber(f"tcp://127.0.0.1:{port + r}", bind=True))
            return subs
        except zmq.ZMQError:
            for sub in subs:
                sub.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def by_engine(text: str, name: str, **labels: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, value in samples(text, name).items():
        d = dict(key)
        if all(d.get(k) == v for k, v in labels.items()):
            found[d["engine"]] = found.get(d["engine"], 0.0) + value
    return found


def dp_app(k: int, **engine: object) -> AppClient:
    return AppClient(make_app(settings(data_parallel_size=k), **engine))


async def test_a_burst_spreads_across_ranks_and_metrics_say_which() -> None:
    async with dp_app(2) as c:
        body = {"prompt": "hello there, data parallel", "max_tokens": 8}
        replies = await asyncio.gather(
            *(c.http.post("/v1/completions", json=body) for _ in range(40))
        )
        assert [r.status_code for r in replies] == [200] * 40
        text = (await c.http.get("/metrics")).text
        done = by_engine(text, "vllm:request_success_total", finished_reason="length")
        assert sum(done.values()) == 40
        # Least loaded, waiting weighed 4×: a burst lands about evenly on both ranks.
        assert set(done) == {"0", "1"} and min(done.values()) >= 12, done
        # Every vLLM family has one series per engine, each engine its own KV cache.
        families = (
            "vllm:num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total",
            "vllm:time_to_first_token_seconds_count",
        )
        for name in families:
            assert set(by_engine(text, name)) == {"0", "1"}, name
        info = samples(text, "vllm:cache_config_info")
        assert sorted(dict(k)["engine"] for k in info) == ["0", "1"]
        assert c.state.engines[0].core.pool is not c.state.engines[1].core.pool


async def test_a_rank_is_pinned_by_header_or_field() -> None:
    async with dp_app(3) as c:
        prompt = {"prompt": "pin me", "max_tokens": 2}
        for _ in range(4):
            r = await c.http.post(
                "/v1/completions", json=prompt, headers={"X-data-parallel-rank": "2"}
            )
            assert r.status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = await c.http.post("/v1/chat/completions", json={**chat, "data_parallel_rank": 1})
        assert r.status_code == 200
        # Both spellings together must agree (header names are case-insensitive).
        r = await c.http.post(
            "/v1/chat/completions",
            json={**chat, "data_parallel_rank": 1},
            headers={"x-data-parallel-rank": "1"},
        )
        assert r.status_code == 200
        text = (await c.http.get("/metrics")).text
        done = by_engine(text, "vllm:request_success_total")
        assert done == {"0": 0.0, "1": 2.0, "2": 4.0}


@pytest.mark.parametrize(
    ("headers", "extra", "message"),
    [
        ({"X-data-parallel-rank": "3"}, {}, r"data_parallel_rank 3 is out of range \[0, 3\)"),
        ({}, {"data_parallel_rank": 7}, r"data_parallel_rank 7 is out of range"),
        ({}, {"data_parallel_rank": True}, "valid integer"),
        ({}, {"data_parallel_rank": "1"}, "valid integer"),
        ({"X-data-parallel-rank": "0"}, {"data_parallel_rank": 1}, "disagree"),
        ({}, {"data_parallel_rank": -1}, "data_parallel_rank"),
    ],
)
async def test_bad_ranks_are_client_errors(
    headers: dict[str, str], extra: dict[str, object], message: str
) -> None:
    async with dp_app(3) as c:
        r = await c.http.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2, **extra}, headers=headers
        )
        assert r.status_code == 400
        error = r.json()["error"]
        assert re.search(message, error["message"]), error
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert c.state.engines.num_open_streams == 0


async def test_a_header_that_is_not_a_rank_is_ignored_as_in_vllm() -> None:
    async with dp_app(2) as c:
        for value in ("one", "1.0", ""):
            r = await c.http.post(
                "/v1/completions",
                json={"prompt": "x", "max_tokens": 2},
                headers={"X-data-parallel-rank": value},
            )
            assert r.status_code == 200, value


async def test_a_request_id_in_use_on_any_rank_is_refused() -> None:
    c = AppClient(make_app(settings(data_parallel_size=2)))
    c.state.engines.start = lambda: None  # requests stay open
    async with c:
        c.state.engines[0].add_request(req("same", [5] * 8))
        r = await c.http.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 2, "data_parallel_rank": 1},
            headers={"X-Request-Id": "same"},
        )
        assert r.status_code == 400 and "already in use" in r.json()["error"]["message"]
        assert c.state.engines[1].num_open_streams == 0
        # A choice of n > 1 runs as `<j>_<id>`: the second's id is in use on rank 0.
        c.state.engines[0].add_request(req("1_pair", [5] * 8))
        r = await c.http.post(
            "/v1/completions",
            json={"prompt": "x", "max_tokens": 2, "n": 2, "data_parallel_rank": 1},
            headers={"X-Request-Id": "pair"},
        )
        assert r.status_code == 400 and "1_pair" in r.json()["error"]["message"]
        assert c.state.engines[1].num_open_streams == 0


async def test_queue_limit_counts_every_rank() -> None:
    # vLLM 0.34: the API server's limit, over the requests in flight on every rank it routes
    # to (size it as ranks x max_num_seqs plus a queue).
    c = AppClient(make_app(settings(data_parallel_size=2, max_num_queued_reqs=1)))
    # Loops not started: what is added stays waiting. Rank 0 holds the one request allowed.
    c.state.engines.start = lambda: None
    async with c:
        c.state.engines[0].add_request(req("queued", [5] * 8))
        for rank in (0, 1):
            body = {"prompt": "x", "max_tokens": 2, "data_parallel_rank": rank}
            r = await c.http.post("/v1/completions", json=body)
            assert r.status_code == 503 and "currently busy" in r.json()["error"]["message"]
        assert [e.num_waiting for e in c.state.engines] == [1, 0]


@pytest.fixture(scope="module")
def dp_events_server() -> Iterator[tuple[ServerThread, int, list[Subscriber]]]:
    # The router binds (llm-d's layout): the engine of rank r dials port + r. Replay sockets
    # are always bound by the engine; with a wildcard port each rank binds a free one.
    subs = subscribers_on_consecutive_ports(2)
    sub_port = int(subs[0].endpoint.rpartition(":")[2])
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"tcp://127.0.0.1:{sub_port}",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv@{host}:{port}@{model}",
    )
    app = make_app(
        settings(kv_events=config, data_parallel_size=2, port=8200, served_model_names=("dp",)),
        block_size=BLOCK,
    )
    try:
        with ServerThread(app) as srv:
            yield srv, sub_port, subs
    finally:
        for sub in subs:
            sub.close()


def test_each_rank_publishes_on_its_own_port(
    dp_events_server: tuple[ServerThread, int, list[Subscriber]],
) -> None:
    srv, sub_port, subs = dp_events_server
    body = httpx.get(srv.url + "/kv_event_sources", timeout=10).json()
    ranks = {int(rank): s for rank, s in body.items()}
    assert all(s["data_parallel_rank"] == r for r, s in ranks.items())
    assert sorted(ranks) == [0, 1]
    for r, source in ranks.items():
        assert source["endpoint"] == f"tcp://127.0.0.1:{sub_port + r}"
        assert source["mode"] == "connect"
        # The port each rank's replay socket was given, not the wildcard.
        assert re.fullmatch(r"tcp://127\.0\.0\.1:\d+", source["replay_endpoint"]), source
        assert source["replay_connect"] == source["replay_endpoint"]
        assert source["topic"] == "kv@127.0.0.1:8200@dp"  # one topic; the rank is in the payload
    assert ranks[0]["replay_endpoint"] != ranks[1]["replay_endpoint"]
    prompts = {r: [100 + 1000 * r + i for i in range(3 * BLOCK)] for r in (0, 1)}
    # (Closed when done: a client's pooled socket left to the collector warns in a later test.)
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        for r, prompt in prompts.items():
            client.completions.create(
                model="dp", prompt=prompt, max_tokens=1,
                extra_headers={"X-data-parallel-rank": str(r)},
            )  # fmt: skip
    for r, sub in enumerate(subs):
        seq = httpx.get(srv.url + "/kv_event_sources", timeout=10).json()[str(r)]["next_seq"]
        got = {m.seq: m for m in sub.wait_for_seq(seq - 1)}
        # The PUB may drop what it sent before the subscription arrived: replay fills it in.
        for m in replay(ranks[r]["replay_endpoint"], 0):
            got.setdefault(m.seq, m)
        assert sorted(got) == list(range(seq))
        assert {m.batch.data_parallel_rank for m in got.values()} == {r}
        stored = [
            t
            for m in got.values()
            for e in m.batch.events
            if type(e).__name__ == "BlockStored"
            for t in e.token_ids
        ]
        # Each rank announces its own prompt's blocks, and only those.
        assert stored == prompts[r][: 3 * BLOCK]


def test_wildcard_endpoints_give_each_rank_its_own_port_named_in_sources() -> None:
    # Bind mode (`*` in the endpoint): each rank's PUB and replay ROUTER bind ports the system
    # picks, and /kv_event_sources names the real ones, ready to subscribe to.
    config = KVEventsConfig(
        enable_kv_cache_events=True, endpoint="tcp://*:*", replay_endpoint="tcp://*:*"
    )
    app = make_app(settings(kv_events=config, data_parallel_size=2), block_size=BLOCK)
    # Subscribed at once, while the start-up batches wait for a subscriber.
    subs = [Subscriber(connectable(p.endpoint, "127.0.0.1")) for p in app.state.mocker.publishers]
    try:
        with ServerThread(app) as srv:
            body = httpx.get(srv.url + "/kv_event_sources", timeout=10).json()
            sources = [body[str(r)] for r in range(len(body))]
            assert [s["data_parallel_rank"] for s in sources] == [0, 1]
            for sub, source in zip(subs, sources, strict=True):
                assert source["mode"] == "bind"
                assert re.fullmatch(r"tcp://\*:\d+", source["endpoint"]), source
                assert re.fullmatch(r"tcp://\*:\d+", source["replay_endpoint"]), source
                assert sub.endpoint.rpartition(":")[2] == source["endpoint"].rpartition(":")[2]
            ports = {
                s[k].rpartition(":")[2] for s in sources for k in ("endpoint", "replay_endpoint")
            }
            assert len(ports) == 4  # four sockets, four ports
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
            for r, (sub, source) in enumerate(zip(subs, sources, strict=True)):
                prompt = [100 + 1000 * r + i for i in range(2 * BLOCK)]
                client.completions.create(
                    model="mocker",
                    prompt=prompt,
                    max_tokens=1,
                    extra_headers={"X-data-parallel-rank": str(r)},
                )
                now = httpx.get(srv.url + "/kv_event_sources", timeout=10).json()[str(r)]
                got = {m.seq: m for m in sub.wait_for_seq(now["next_seq"] - 1)}
                # Anything the PUB sent before the subscription arrived: from replay.
                for m in replay(connectable(source["replay_endpoint"], "127.0.0.1"), 0):
                    got.setdefault(m.seq, m)
                assert sorted(got) == list(range(now["next_seq"]))
                assert {m.batch.data_parallel_rank for m in got.values()} == {r}
                stored = [t for m in got.values() for e in m.batch.events
                          if type(e).__name__ == "BlockStored" for t in e.token_ids]  # fmt: skip
                assert stored == prompt
    finally:
        for sub in subs:
            sub.close()
