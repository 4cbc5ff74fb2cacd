"""A test-side consumer of the KV-event wire format: msgspec structs written from vLLM's
(vllm/distributed/kv_events.py: map and array layouts), and a SUB / DEALER client on real
ZMQ sockets.

No `from __future__ import annotations`: msgspec must see the local struct classes."""

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def wire_types(array_like: bool) -> tuple[type, tuple[type, type, type]]:
    """(EventBatch, (BlockStored, BlockRemoved, AllBlocksCleared)) for one event layout.

    Fields without a default must be present on the wire, null or not; unknown fields are
    rejected, so an extra or a missing field fails the decode."""

    class Event(msgspec.Struct, tag=True, array_like=array_like, forbid_unknown_fields=True):
        pass

    # vLLM's ExternalBlockHash: a 64-bit int, or the full digest with
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
    class BlockStored(Event):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[Any] | None = None
        # vLLM 0.34's optional trailing fields (KV cache groups, tier locality, the offload
        # tier that made it, the request's session, lookahead hashing's tokens).
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None
        locality: str | None = None
        ownership: str | None = None
        session_id: str | None = None
        lookahead_token_ids: list[list[int]] | None = None

    class BlockRemoved(Event):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None
        locality: str | None = None
        ownership: str | None = None

    class AllBlocksCleared(Event):
        pass

    class EventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
        ts: float
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]
        data_parallel_rank: int | None

    return EventBatch, (BlockStored, BlockRemoved, AllBlocksCleared)


def decoder(array_like: bool = False) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(wire_types(array_like)[0])


@dataclass
class Received:
    topic: bytes
    seq: int
    batch: Any


@dataclass
class Subscriber:
    """A SUB socket read by a background thread; `bind` for the engine-connects layout.

    Bound to a wildcard port (`tcp://127.0.0.1:*`), `endpoint` becomes the bound one, with
    the port the system picked: the engine is then pointed at it."""

    endpoint: str
    bind: bool = False
    array_like: bool = False
    got: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        try:
            self._sock.setsockopt(zmq.SUBSCRIBE, b"")
            self._sock.setsockopt(zmq.RCVTIMEO, 50)
            if self.bind:
                self._sock.bind(self.endpoint)
                self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._sock.connect(self.endpoint)
        except zmq.ZMQError:
            self._sock.close(linger=0)
            self._ctx.term()
            raise
        self._decode = decoder(self.array_like).decode
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                topic, seq, payload = self._sock.recv_multipart()
            except zmq.Again:
                continue
            received = Received(topic, int.from_bytes(seq, "big"), self._decode(payload))
            with self._lock:
                self.got.append(received)

    def messages(self) -> list[Received]:
        with self._lock:
            return list(self.got)

    def wait_for_seq(self, seq: int, timeout: float = 10.0) -> list[Received]:
        """Every message up to and including sequence number `seq`."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.messages()
            if got and got[-1].seq >= seq:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"seq {seq} not received; last {got[-1].seq if got else None}")
            time.sleep(0.005)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(linger=0)
        self._ctx.term()


def replay(
    endpoint: str, start: int, array_like: bool = False, timeout_ms: int = 10_000
) -> list[Received]:
    """Ask the ROUTER replay socket for every buffered batch from `start`, as a DEALER client;
    returns them once the end marker arrived (TimeoutError if it never does)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    decode = decoder(array_like).decode
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[Received] = []
        while True:
            try:
                frames = sock.recv_multipart()
            except zmq.Again:
                raise TimeoutError("no replay end marker") from None
            empty, topic, seq, payload = frames
            assert empty == b""
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                return out
            out.append(Received(topic, int.from_bytes(seq, "big"), decode(payload)))
    finally:
        sock.close(linger=0)
        ctx.term()
