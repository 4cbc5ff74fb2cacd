"""The NIXL side channel between live engines (ZMQ, msgpack), mocked to vLLM's shape: a
prefill engine's ROUTER at (VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT + rank)
answers vLLM's `get_meta_msg` handshake and the decode side's read notifications (what NIXL
sends as `"<remote_request_id>:<consumers>"` once a READ completed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import zmq
import zmq.asyncio

from mocker.config import ConfigError
from mocker.disagg.params import RemotePrefill
from mocker.disagg.pulls import PdCounters, Pull

if TYPE_CHECKING:
    from mocker.engine.live import LiveEngine

__all__ = ["GET_META_MSG", "HB_MSG", "NOTIF_MSG", "SideChannelClient", "SideChannelServer"]

logger = logging.getLogger(__name__)

GET_META_MSG = b"get_meta_msg"  # vLLM's handshake request: (GET_META_MSG, pp_rank, tp_rank)
# mocker's stand-in for a NIXL notification: (NOTIF_MSG, engine id, "<request id>:1", nonce),
# answered with (nonce, whether the blocks were still held).
NOTIF_MSG = b"notif"
# A decode engine's lease heartbeat: (HB_MSG, engine id, "HB:<id>,<id>..."), vLLM's text, no
# answer.
HB_MSG = b"hb"
# vLLM gives a handshake 5 s; a notification the prefill engine does not answer in that time
# fails the pull (the request recomputes).
ANSWER_TIMEOUT_S = 5.0

_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode


async def _send(sock: zmq.asyncio.Socket, frame: bytes) -> None:
    """Send one frame. Closing a socket cancels the sends still waiting on it (pyzmq), as
    when another question to the same dead peer timed out first and dropped it: that ends
    this send as failed, not the task it runs in (a heartbeat loop, a question)."""
    try:
        await sock.send(frame)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the task itself is cancelled (a timeout, shutdown)
        raise zmq.ZMQError(zmq.ENOTSOCK, "side channel dropped") from None


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait for each to end."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class SideChannelServer:
    """A prefill engine's side channel. Bound at construction (a taken port stops start-up);
    served by one task; every answer that touches engine state goes through the engine
    loop's inbox."""

    def __init__(self, engine: LiveEngine, host: str, port: int, counters: PdCounters,
                 context: zmq.asyncio.Context | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.counters = counters
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as exc:
            self._sock.close()
            raise ConfigError(
                f"NIXL side channel: cannot bind tcp://{host}:{port} ({exc}); set "
                "VLLM_NIXL_SIDE_CHANNEL_PORT to a free port"
            ) from None
        endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.host = host
        self.port = int(endpoint.rsplit(":", 1)[1])  # the bound port (0 picks one)
        self._task: asyncio.Task[None] | None = None
        self._answers: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="side-channel")

    async def close(self) -> None:
        await _cancel([t for t in (self._task, *self._answers) if t is not None])
        self.close_now()

    def close_now(self) -> None:
        """Close the socket (start-up failed: no task runs yet)."""
        self._sock.close()

    async def _serve(self) -> None:
        sock = self._sock
        while True:
            frames = await sock.recv_multipart()
            # A REQ peer (vLLM's handshake) puts an empty delimiter before its message.
            envelope, body = frames[:-1], frames[-1]
            try:
                message = _decode(body)
            except msgspec.DecodeError:
                logger.warning("side channel: undecodable message dropped")
                continue
            task = asyncio.get_running_loop().create_task(self._answer(envelope, message))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)

    async def _answer(self, envelope: list[bytes], message: Any) -> None:
        if not isinstance(message, list) or not message:
            return
        kind = message[0]
        if kind == GET_META_MSG:
            await self._sock.send_multipart(
                [*envelope, self._handshake(), _encode(time.perf_counter())]
            )
        elif kind == HB_MSG and len(message) == 3:
            engine_id, text = message[1], message[2]
            if engine_id == self.engine.core.config.transfer.kv_engine_id and isinstance(text, str):
                hold_ids = tuple(i for i in text.removeprefix("HB:").split(",") if i)
                self.engine.extend_holds(hold_ids)
        elif kind == NOTIF_MSG and len(message) == 4:
            engine_id, text, nonce = message[1], message[2], message[3]
            held = await self._notified(engine_id, text)
            await self._sock.send_multipart([*envelope, _encode([nonce, held])])

    def _handshake(self) -> bytes:
        """vLLM's NixlHandshakePayload shape; the agent metadata is what a mock has."""
        core = self.engine.core
        config = core.config
        metadata = {
            "engine_id": config.transfer.kv_engine_id,
            "num_blocks": config.cache.num_gpu_blocks,
            "block_size": config.block_size,
            "block_lens": [config.block_bytes],
            "kv_cache_layout": "HND",
            "attn_backend_name": "MOCKER",
        }
        return _encode({"compatibility_hash": "mocker", "agent_metadata_bytes": _encode(metadata)})

    async def _notified(self, engine_id: Any, text: Any) -> bool:
        """A decode engine read (or gave up on) a held request: free it. False when this
        engine is not the one named (restarted: a new engine id) or holds nothing under it."""
        if not isinstance(text, str) or engine_id != self.engine.core.config.transfer.kv_engine_id:
            return False
        hold_id = text.rsplit(":", 1)[0]
        held = await self.engine.release_hold(hold_id)
        if not held:
            self.counters.notifications_after_expiry += 1
            logger.warning(
                "Potentially invalid KV blocks for unrecognized request %s were retrieved by "
                "a decode worker. They may have expired.", hold_id,
            )  # fmt: skip
        return held


@dataclass(slots=True, eq=False)
class _Peer:
    """One prefill side channel as a decode engine sees it: a DEALER socket, the questions
    waiting for their answers (by nonce), and the task that reads the answers."""

    sock: zmq.asyncio.Socket
    waiting: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None


class SideChannelClient:
    """A decode engine's way to its prefill engines (mocker.disagg.pulls.PrefillPeers): one
    DEALER per prefill side channel. Questions carry a nonce and are answered in any order,
    so a slow or dead peer never holds up another question, and a late answer is dropped.
    Every read notification gets its answer into the engine loop's inbox, even when the
    peer never answers (then: not held, after ANSWER_TIMEOUT_S)."""

    def __init__(self, engine: LiveEngine, counters: PdCounters,
                 context: zmq.asyncio.Context | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.counters = counters
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._peers: dict[tuple[str, int], _Peer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._nonce = 0

    def start(self) -> None:
        """Heartbeats for the holds this engine's requests want, every sixth of the lease
        (vLLM's interval; the lease simulated, so divided by the speedup ratio)."""
        config = self.engine.core.config
        interval = config.transfer.hold_timeout / config.speedup_ratio / 6
        self._spawn(self._heartbeats(interval))

    async def _heartbeats(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.engine.is_dead:
                return  # its requests are gone: their holds expire a lease from now
            wanted: dict[tuple[str, int, str], list[str]] = {}
            for remote in self.engine.core.remote_sources():
                key = (remote.host, remote.port, remote.engine_id)
                wanted.setdefault(key, []).append(remote.request_id)
            for (host, port, engine_id), hold_ids in wanted.items():
                message = [HB_MSG, engine_id, "HB:" + ",".join(hold_ids)]
                try:
                    peer = self._peer(host, port)
                    # (Not wait_for: on 3.11 a cancel that arrives as the send fails is lost,
                    # and the loop, shut down, would sleep on forever.)
                    async with asyncio.timeout(ANSWER_TIMEOUT_S):
                        await _send(peer.sock, _encode(message))
                except (TimeoutError, zmq.ZMQError) as exc:
                    logger.warning("NIXL heartbeat to %s:%d failed: %r", host, port, exc)
                    self._drop(host, port, self._peers.get((host, port)))

    # -- PrefillPeers (called from the engine loop, synchronously) ----------------------------

    def read_done(self, pull: Pull) -> bool | None:
        self._spawn(self._notify(pull.remote, pull.request.request_id))
        return None

    def release(self, remote: RemotePrefill) -> None:
        self._spawn(self._notify(remote, None))

    # -- the network ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self, remote: RemotePrefill, request_id: str | None) -> None:
        """Tell the prefill engine; with `request_id` (a pull), its answer decides the pull
        (always delivered: a failure is "not held")."""
        held = False
        try:
            held = await self._ask(remote)
        except (TimeoutError, zmq.ZMQError) as exc:
            self.counters.failed_notifications += 1
            if request_id is None:
                self.counters.failed_releases += 1
            logger.warning("NIXL notification to %s:%d failed: %r", remote.host, remote.port, exc)
        finally:
            if request_id is not None:
                self.engine.answer_pull(request_id, held)

    async def _ask(self, remote: RemotePrefill) -> bool:
        peer = self._peer(remote.host, remote.port)
        self._nonce += 1
        nonce = self._nonce
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        peer.waiting[nonce] = answer
        try:
            message = [NOTIF_MSG, remote.engine_id, f"{remote.request_id}:1", nonce]
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                await _send(peer.sock, _encode(message))
                return await answer
        except TimeoutError:
            # A peer that does not answer in time is dropped: what it had queued goes with
            # its socket, and the next question opens a fresh one.
            self._drop(remote.host, remote.port, peer)
            raise
        finally:
            peer.waiting.pop(nonce, None)
            # A drop that failed it while this question was still being sent (its send then
            # raised instead): its failure is this one's, not a loose end for the loop's log.
            if answer.done() and not answer.cancelled():
                answer.exception()

    def _peer(self, host: str, port: int) -> _Peer:
        peer = self._peers.get((host, port))
        if peer is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            # Nothing queues for a peer not connected (a dead one): sends wait, and time out.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            try:
                sock.connect(f"tcp://{host}:{port}")
            except zmq.ZMQError:
                sock.close()  # a host or port that is no address: nothing to keep
                raise
            peer = self._peers[(host, port)] = _Peer(sock)
            peer.reader = asyncio.get_running_loop().create_task(self._read(peer))
        return peer

    def _drop(self, host: str, port: int, peer: _Peer | None) -> None:
        """Close this peer's socket (if it is still the one in use for the address); the
        questions it still waits for fail (not held)."""
        if peer is None or self._peers.get((host, port)) is not peer:
            return
        del self._peers[(host, port)]
        if peer.reader is not None:
            peer.reader.cancel()
        for answer in peer.waiting.values():
            if not answer.done():
                answer.set_exception(TimeoutError("side channel dropped"))
        peer.sock.close()

    async def _read(self, peer: _Peer) -> None:
        """Hand each answer to the question it answers (none: it came too late)."""
        while True:
            frame = await peer.sock.recv()
            try:
                nonce, held = _decode(frame)
                answer = peer.waiting.get(nonce)
            except (msgspec.DecodeError, TypeError, ValueError):
                logger.warning("side channel: undecodable answer dropped")
                continue
            if answer is not None and not answer.done():
                answer.set_result(bool(held))

    async def close(self) -> None:
        await _cancel([*self._tasks, *(p.reader for p in self._peers.values() if p.reader)])
        self.close_now()

    def close_now(self) -> None:
        for peer in self._peers.values():
            peer.sock.close()
        self._peers.clear()
