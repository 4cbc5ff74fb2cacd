"""The NIXL side channel over real ZMQ sockets on loopback: vLLM's handshake shape, a pull's
read notification freeing the prefill engine's hold, and the failures (another engine id, a
peer that never answers)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest
import zmq
import zmq.asyncio

from mocker.config_choices import KVRole
from mocker.disagg import side_channel
from mocker.disagg.params import RemotePrefill, parse_transfer_params
from mocker.disagg.pulls import PdCounters
from mocker.disagg.side_channel import GET_META_MSG, SideChannelClient, SideChannelServer
from mocker.engine.core import EngineCore
from mocker.engine.live import LiveEngine
from mocker.engine.outputs import RequestOutput
from mocker.request import EngineRequest, SamplingParams
from tests.support.engines import small_config

PROMPT = list(range(100, 164))  # 64 tokens: 4 blocks of 16


def _engine(role: KVRole, engine_id: str, **changes: object) -> LiveEngine:
    settings: dict[str, object] = {
        "block_size": 16, "num_gpu_blocks": 64, "max_num_batched_tokens": 256,
        "max_model_len": 512, "speedup_ratio": 1000.0, "kv_role": role,
        "kv_engine_id": engine_id,
    }  # fmt: skip
    return LiveEngine(EngineCore(small_config(**(settings | changes))))


@asynccontextmanager
async def pair(
    engine_id: str = "P",
    *,
    heartbeats: bool = False,
    hold_timeout: float | None = None,
    **decode_changes: object,
) -> AsyncIterator[tuple[LiveEngine, LiveEngine, PdCounters]]:
    """A prefill engine serving a side channel on a port of the system's choosing, and a
    decode engine whose pulls notify it (and, with `heartbeats`, keep its leases alive);
    `hold_timeout`: the prefill engine's lease (simulated seconds; vLLM's 30 by default)."""
    same: dict[str, object] = {k: v for k, v in decode_changes.items() if k == "speedup_ratio"}
    if hold_timeout is not None:
        same["hold_timeout"] = hold_timeout
    prefill = _engine(KVRole.PRODUCER, engine_id, **same)
    decode = _engine(KVRole.CONSUMER, "D", **decode_changes)
    counters = PdCounters()
    server = SideChannelServer(prefill, "127.0.0.1", 0, counters)
    prefill.core.side_channel = ("127.0.0.1", server.port)
    client = SideChannelClient(decode, counters)
    assert decode.core.pulls is not None
    decode.core.pulls.peers = client
    for engine in (prefill, decode):
        engine.start()
    server.start()
    if heartbeats:
        client.start()
    try:
        yield prefill, decode, counters
    finally:
        await client.close()
        await server.close()
        for engine in (prefill, decode):
            await engine.stop()


async def _outputs(engine: LiveEngine, spec: EngineRequest) -> list[RequestOutput]:
    return [out async for out in engine.generate(spec)]


async def _prefill(prefill: LiveEngine) -> dict[str, object]:
    spec = EngineRequest("p1", PROMPT, SamplingParams(max_tokens=1), remote_decode=True)
    (out,) = await _outputs(prefill, spec)
    params = out.kv_transfer_params
    assert isinstance(params, dict)
    return params


def _decode_spec(params: dict[str, object]) -> EngineRequest:
    return EngineRequest("d1", PROMPT, SamplingParams(max_tokens=2),
                         remote_prefill=parse_transfer_params(params)[1])  # fmt: skip


async def test_handshake_answers_vllms_two_frames() -> None:
    async with pair() as (prefill, _, _):
        host, port = prefill.core.side_channel
        ctx = zmq.asyncio.Context.instance()
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(f"tcp://{host}:{port}")
        try:
            await req.send(msgspec.msgpack.encode((GET_META_MSG, 0, 0)))
            payload, clock = await asyncio.wait_for(req.recv_multipart(), 10)
        finally:
            req.close()
        handshake = msgspec.msgpack.decode(payload)
        assert set(handshake) == {"compatibility_hash", "agent_metadata_bytes"}
        metadata = msgspec.msgpack.decode(handshake["agent_metadata_bytes"])
        assert metadata["engine_id"] == "P" and metadata["block_size"] == 16
        assert isinstance(msgspec.msgpack.decode(clock), float)


async def test_a_pull_frees_the_prefill_hold() -> None:
    async with pair() as (prefill, decode, counters):
        params = await _prefill(prefill)
        assert prefill.core.pool.num_used == 4  # held for the pull
        outs = await asyncio.wait_for(_outputs(decode, _decode_spec(params)), 20)
        assert outs[0].tier_hits == (("p2p", 64),)
        assert prefill.core.pool.num_used == 0 and not prefill.core.holds
        assert counters == PdCounters()


async def test_a_restarted_prefill_engine_refuses_and_decode_recomputes() -> None:
    # The same address, another engine id: what a restarted vLLM prefill engine is. (A lease
    # far longer than the test: at speedup 1000 vLLM's 30 s are 30 ms, which a busy machine
    # may spend before the refusal, and the hold would be gone for that reason instead.)
    async with pair(engine_id="P-restarted", hold_timeout=1e6) as (prefill, decode, _):
        params = await _prefill(prefill)
        params = {**params, "remote_engine_id": "P"}
        outs = await asyncio.wait_for(_outputs(decode, _decode_spec(params)), 20)
        assert outs[0].tier_hits == ()
        assert decode.core.pulls is not None and decode.core.pulls.num_failed == 1
        assert prefill.core.holds  # not the engine named: its own hold stands


async def test_a_silent_peer_fails_the_pull_after_the_answer_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(side_channel, "ANSWER_TIMEOUT_S", 0.2)
    ctx = zmq.asyncio.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # bound, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        async with pair() as (_, decode, counters):
            params = {"do_remote_prefill": True, "remote_block_ids": [[0, 1, 2, 3]],
                      "remote_engine_id": "P", "remote_request_id": "p1",
                      "remote_host": "127.0.0.1", "remote_port": port}  # fmt: skip

            async def one(i: int) -> list[RequestOutput]:
                await asyncio.sleep(0.05 * i)  # staggered: their questions overlap
                spec = dataclasses.replace(_decode_spec(params), request_id=f"d{i}")
                return await _outputs(decode, spec)

            # Three pulls from the same silent peer: every one gets its (negative) answer
            # and recomputes; none waits for another's.
            runs = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(3))), 20)
            for outs in runs:
                assert outs[-1].finished
                assert outs[0].tier_hits == ()
            assert counters.failed_notifications == 3
            assert decode.core.pool.num_used == 0
    finally:
        silent.close()


@pytest.mark.parametrize("heartbeats", [True, False])
async def test_heartbeats_keep_a_lease_alive_through_a_long_pull(heartbeats: bool) -> None:
    # A 30 s lease and a pull of about 60 s (4 blocks of 2 MiB at 0.00014 GB/s), at speedup
    # 100: 0.3 s and 0.6 s of wall time; heartbeats every 50 ms, each good for 200 ms (so a
    # busy machine may delay one by 150 ms).
    async with pair(heartbeats=heartbeats, pull_gbps=0.00014, pull_timeout=300.0,
                    speedup_ratio=100.0) as (
        prefill, decode, _,
    ):  # fmt: skip
        params = await _prefill(prefill)
        outs = await asyncio.wait_for(_outputs(decode, _decode_spec(params)), 20)
        pulled = outs[0].tier_hits == (("p2p", 64),)
        # With heartbeats the KV was still held at the end of the pull; without, the lease
        # ran out first and the request recomputed.
        assert pulled is heartbeats
        assert prefill.core.holds is not None
        assert prefill.core.holds.num_expired == (0 if heartbeats else 1)
        assert prefill.core.pool.num_used == 0


@pytest.mark.parametrize("heartbeat_first", [True, False])
async def test_a_peer_dropped_while_sends_wait_fails_them_and_heartbeats_go_on(
    monkeypatch: pytest.MonkeyPatch, heartbeat_first: bool
) -> None:
    # A prefill replica killed mid-pull: its port refuses connections, so sends to it wait.
    # Whichever send times out first drops the peer, which closes its socket, and pyzmq
    # cancels the other sends still waiting on it. A release so cut short must still be
    # counted (tests/api/test_pd_live.py counts them, on a loaded machine too), and a
    # heartbeat so cut short must not end the heartbeat loop.
    monkeypatch.setattr(side_channel, "ANSWER_TIMEOUT_S", 0.3)
    dead = socket.socket()  # bound, never listening: connections refused, the port kept
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    remote = RemotePrefill("P", "p1", (0, 1, 2, 3), "127.0.0.1", port)
    decode = _engine(KVRole.CONSUMER, "D", speedup_ratio=1.0, hold_timeout=0.6)
    counters = PdCounters()
    client = SideChannelClient(decode, counters)  # heartbeats every 0.1 s
    wanted = [remote]
    monkeypatch.setattr(decode.core, "remote_sources", lambda: wanted)
    loose: list[str] = []  # what the loop would log: an exception no one retrieved
    asyncio.get_running_loop().set_exception_handler(lambda _, c: loose.append(c["message"]))
    try:
        if heartbeat_first:
            client.start()  # its send times out first and drops the peer
            await asyncio.sleep(0.15)
            client.release(remote)
        else:
            client.release(remote)  # times out first, its drop cuts the heartbeat's send
            await asyncio.sleep(0.05)
            client.start()
        for _ in range(1000):  # (0.3 s of timeout; up to 10 s on a busy machine)
            if counters.failed_releases:
                break
            await asyncio.sleep(0.01)
        assert counters.failed_releases == 1
        await asyncio.sleep(0.2)  # more heartbeats, each failing (the peer is still dead)
        (heartbeats,) = [
            t for t in client._tasks if getattr(t.get_coro(), "__name__", None) == "_heartbeats"
        ]
        assert not heartbeats.done()  # still beating, for the holds still wanted
    finally:
        await client.close()
        dead.close()
    gc.collect()
    assert loose == []
