"""The ZMQ KV-event publisher: a PUB socket fed by a bounded queue and a ROUTER replay socket."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from mocker.config import ConfigError
from mocker.kv.events import AllBlocksCleared, KVEvent
from mocker.kvevents.config import (
    BIND_PREFIX,
    EventFormat,
    KVEventsConfig,
    binds,
    wildcard_port,
    with_port,
)
from mocker.kvevents.wire import CURRENT, END_SEQ, BatchEncoder, Dialect, seq_bytes

__all__ = ["ZmqEventPublisher"]

logger = logging.getLogger(__name__)

_Item = tuple[int, float, Sequence[KVEvent]]
# How long the first batch (AllBlocksCleared) waits for a subscriber before it is sent
# anyway: a PUB drops what it sends before a subscription has arrived, and in llm-d's layout
# (the engine connects to a waiting consumer) the handshake takes a few milliseconds.
FIRST_SUBSCRIBER_WAIT_S = 3.0
_SLICE_S = 0.05  # how often waiting threads look at the stop flag
_MAX_SOCKOPT = 2**31 - 1


class ZmqEventPublisher:
    """Publishes one msgpack batch per engine step, as vLLM's ZmqEventPublisher does.

    The engine loop only appends (sequence number, time, events) to a bounded
    queue; a sender thread encodes each batch, sends it as (topic, 8-byte
    big-endian sequence, payload) and keeps the last `buffer_steps` payloads.
    Sequence numbers are assigned at enqueue by the single producer, so they are
    gap-free from 0. A slow subscriber is governed by the PUB socket's
    high-water mark (ZMQ drops for that subscriber), never by the engine. A
    second thread owns the ROUTER replay socket and answers from a snapshot of
    the buffer, so replays never hold up live batches.

    The first batch is AllBlocksCleared, so a consumer that knew an earlier life
    of this engine drops what it learned then; it waits (up to
    FIRST_SUBSCRIBER_WAIT_S, later batches queueing behind it) for a subscriber,
    which the socket (an XPUB: a PUB that reports subscriptions) tells it of.
    """

    def __init__(
        self,
        config: KVEventsConfig,
        *,
        topic: str = "",
        rank: int = 0,
        fmt: EventFormat = EventFormat.MAP,
        dialect: Dialect = CURRENT,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        first_subscriber_wait_s: float = FIRST_SUBSCRIBER_WAIT_S,
        full_hashes: bool = False,
    ) -> None:
        self.rank = rank
        self.topic = topic
        self.endpoint = config.endpoint_for(rank)
        self.binds = binds(self.endpoint)
        self.replay_endpoint = config.replay_endpoint_for(rank)
        if self.endpoint.startswith("tcp://0.0.0.0:") and not self.binds:
            logger.warning(
                "kv_events_config.endpoint=%r has no '*': by vLLM's rule it is connected to, "
                "not bound; write tcp://*:PORT to bind every interface (or bind+tcp://HOST:PORT "
                "to bind one address)",
                self.endpoint,
            )
        self._topic = topic.encode()
        self._encoder = BatchEncoder(fmt, rank, dialect, full_hashes)
        self._first_wait = first_subscriber_wait_s
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._buffer_lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx = context if context is not None else zmq.Context.instance()
        try:
            self._pub = self._ctx.socket(zmq.XPUB)
        except zmq.ZMQError as exc:  # e.g. past the context's MAX_SOCKETS
            raise ConfigError(f"kv_events_config: cannot open a ZMQ socket: {exc}") from None
        self._replay: zmq.Socket[bytes] | None = None
        # The replay thread sleeps in poll() until a request comes or close() writes here.
        self._wake_r, self._wake_w = os.pipe() if self.replay_endpoint is not None else (-1, -1)
        try:
            self._setup(config)
        except BaseException:
            self._close_sockets()
            raise
        self.next_seq = 0  # the sequence number of the next batch (written by the producer)
        self.num_events = 0
        self._warned_full = False
        self._closed = False
        self._sender = threading.Thread(target=self._send_loop, name=f"kv-events-{rank}")
        self._sender.daemon = True
        self._sender.start()
        self._replayer: threading.Thread | None = None
        if self._replay is not None:
            self._replayer = threading.Thread(target=self._replay_loop, name=f"kv-replay-{rank}")
            self._replayer.daemon = True
            self._replayer.start()
        self.publish([AllBlocksCleared()])

    def _setup(self, config: KVEventsConfig) -> None:
        pub = self._pub
        try:
            pub.setsockopt(zmq.SNDHWM, config.hwm)
            pub.setsockopt(zmq.LINGER, 200)  # let queued batches out on close
            pub.setsockopt(zmq.IPV6, 1)  # tcp://[::]:PORT, as vLLM's `::` rule allows
        except (zmq.ZMQError, OverflowError, TypeError) as exc:
            raise ConfigError(f"invalid kv_events_config.hwm={config.hwm!r}: {exc}") from None
        self.endpoint = self._attach(pub, "endpoint", self.endpoint, bind=self.binds)
        if self.replay_endpoint is not None:
            try:
                replay = self._replay = self._ctx.socket(zmq.ROUTER)
            except zmq.ZMQError as exc:
                raise ConfigError(f"kv_events_config: cannot open a ZMQ socket: {exc}") from None
            # A whole replay must fit in the socket: past its HWM a ROUTER drops silently.
            replay.setsockopt(zmq.SNDHWM, min(_MAX_SOCKOPT, 2 * config.buffer_steps + 16))
            replay.setsockopt(zmq.LINGER, 0)
            replay.setsockopt(zmq.IPV6, 1)
            self.replay_endpoint = self._attach(
                replay, "replay_endpoint", self.replay_endpoint, bind=True
            )

    @staticmethod
    def _attach(sock: zmq.Socket[bytes], key: str, endpoint: str, *, bind: bool) -> str:
        """Bind or connect `sock`; returns the endpoint as bound: a wildcard port (`*`)
        replaced by the port the system picked, mocker's `bind+` prefix dropped."""
        endpoint = endpoint.removeprefix(BIND_PREFIX)
        try:
            if bind:
                sock.bind(endpoint)
            else:
                sock.connect(endpoint)
        except zmq.ZMQError as exc:
            verb = "bind" if bind else "connect to"
            raise ConfigError(
                f"cannot {verb} kv_events_config.{key}={endpoint!r}: {exc.strerror}"
            ) from None
        if not wildcard_port(endpoint):
            return endpoint
        # Only the port is taken from LAST_ENDPOINT: its host is the system's spelling (with
        # IPV6 on, 127.0.0.1 reads back as [::ffff:127.0.0.1], which an IPv4 peer cannot dial).
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return with_port(endpoint, int(bound.rpartition(":")[2]))

    # -- producer side (the engine loop) ------------------------------------------------------

    def publish(self, events: Sequence[KVEvent], ts: float | None = None) -> int:
        """Queue one step's events as the next batch; returns its sequence number."""
        if self._closed:
            raise RuntimeError("the KV event publisher is closed")
        seq = self.next_seq
        item = (seq, time.time() if ts is None else ts, events)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._put_when_room(item)
        self.next_seq = seq + 1
        self.num_events += len(events)
        return seq

    def _put_when_room(self, item: _Item) -> None:
        # Only a starved sender gets here. Wait rather than drop: a batch missing from the
        # stream would leave every consumer wrong for good.
        if not self._warned_full:
            self._warned_full = True
            logger.warning(
                "KV event queue full (%d batches): the engine waits for the publisher",
                self._queue.maxsize,
            )
        while True:
            if not self._sender.is_alive():
                raise RuntimeError("the KV event publisher thread has stopped")
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=1.0)
                return

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to `timeout`), then stop the threads and close the sockets."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._sender.join(timeout)
        self._stop.set()
        if self._replayer is not None:
            os.write(self._wake_w, b"x")
            self._replayer.join(timeout)
        if self._sender.is_alive() or (self._replayer is not None and self._replayer.is_alive()):
            logger.warning("KV event publisher did not stop within %.1f s", timeout)
            return  # the daemon threads still own the sockets; they go with the process
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    # -- the sender thread --------------------------------------------------------------------

    def _send_loop(self) -> None:
        self._await_first_subscriber()
        get = self._queue.get
        pub, topic, encode = self._pub, self._topic, self._encoder.encode
        buffer, lock = self._buffer, self._buffer_lock
        while True:
            try:
                item = get(timeout=1.0)
            except queue.Empty:
                self._drain_subscriptions()
                continue
            if item is None:
                return
            seq, ts, events = item
            try:
                payload = encode(ts, events)
                pub.send_multipart((topic, seq_bytes(seq), payload))
            except Exception:
                # Keep the thread (and the sequence) alive; consumers see the gap and replay.
                logger.exception("KV event batch %d could not be published", seq)
                continue
            with lock:
                buffer.append((seq, payload))

    def _await_first_subscriber(self) -> None:
        deadline = time.monotonic() + self._first_wait
        while time.monotonic() < deadline and not self._closed:
            if self._pub.poll(int(_SLICE_S * 1000)):  # a subscription arrived
                self._drain_subscriptions()
                return

    def _drain_subscriptions(self) -> None:
        """An XPUB queues a message per new subscription; read them so they never pile up."""
        with contextlib.suppress(zmq.Again):
            while True:
                self._pub.recv(zmq.NOBLOCK)

    # -- the replay thread --------------------------------------------------------------------

    def _replay_loop(self) -> None:
        replay = self._replay
        assert replay is not None
        # No timeout: an idle publisher's thread costs nothing (hundreds of --replicas).
        poller = zmq.Poller()
        poller.register(replay, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stop.is_set():
            if replay not in dict(poller.poll()):
                continue
            try:
                self._serve_replay(replay)
            except zmq.ZMQError:
                logger.exception("KV event replay failed")

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        """One request `[identity, b"", start_seq]`: each buffered batch with seq >= start as
        `[identity, b"", topic, seq, payload]`, then the end marker `[identity, b"", b"",
        seq -1, b""]` (vLLM's framing, vllm/distributed/kv_events.py)."""
        frames = replay.recv_multipart()
        identity = frames[0]
        if len(frames) == 3 and not frames[1] and len(frames[2]) == 8:
            start = int.from_bytes(frames[2], "big")
            with self._buffer_lock:
                batches = [(seq, payload) for seq, payload in self._buffer if seq >= start]
            for seq, payload in batches:
                replay.send_multipart((identity, b"", self._topic, seq_bytes(seq), payload))
        else:
            logger.warning("malformed KV event replay request: %d frames", len(frames))
        replay.send_multipart((identity, b"", b"", END_SEQ, b""))
