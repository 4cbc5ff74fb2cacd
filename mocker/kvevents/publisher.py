"""The ZMQ KV-event publisher: a PUB socket and a ROUTER replay socket served by one thread."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from mocker.config import ConfigError
from mocker.kv.events import AllBlocksCleared, KVEvent
from mocker.kvevents.config import EventFormat, KVEventsConfig, binds
from mocker.kvevents.wire import END_SEQ, BatchEncoder, seq_bytes

__all__ = ["ZmqEventPublisher"]

logger = logging.getLogger(__name__)

_Item = tuple[int, float, Sequence[KVEvent]]
# How long the thread sleeps on an empty queue before it looks at the replay socket again:
# a replay request waits at most this long on an idle engine (vLLM: 100 ms).
_REPLAY_POLL_S = 0.02


class ZmqEventPublisher:
    """Publishes one msgpack batch per engine step, as vLLM's ZmqEventPublisher does.

    The engine loop only appends (sequence number, time, events) to a bounded
    queue; a thread encodes each batch, sends it as (topic, 8-byte big-endian
    sequence, payload) on the PUB socket and keeps the last `buffer_steps`
    payloads for replay. Sequence numbers are assigned at enqueue by the single
    producer, so they are gap-free from 0. A slow subscriber is governed by the
    PUB socket's high-water mark (ZMQ drops for that subscriber), never by the
    engine. The first batch is AllBlocksCleared, so a consumer that knew an
    earlier life of this engine drops what it learned then.
    """

    def __init__(
        self,
        config: KVEventsConfig,
        *,
        topic: str = "",
        rank: int = 0,
        fmt: EventFormat = EventFormat.MAP,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.rank = rank
        self.topic = topic
        self.endpoint = config.endpoint_for(rank)
        self.binds = binds(self.endpoint)
        self.replay_endpoint = config.replay_endpoint_for(rank)
        self._topic = topic.encode()
        self._encoder = BatchEncoder(fmt, rank)
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = context if context is not None else zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.setsockopt(zmq.SNDHWM, config.hwm)
            self._pub.setsockopt(zmq.LINGER, 200)  # let queued batches out on close
            self._attach(self._pub, "endpoint", self.endpoint, bind=self.binds)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # One whole replay must fit in the socket: past its HWM a ROUTER drops.
                self._replay.setsockopt(zmq.SNDHWM, 2 * config.buffer_steps + 16)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._attach(self._replay, "replay_endpoint", self.replay_endpoint, bind=True)
        except BaseException:
            self._close_sockets()
            raise
        self.next_seq = 0  # the sequence number of the next batch (written by the producer)
        self.num_events = 0
        self._warned_full = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{rank}", daemon=True)
        self._thread.start()
        self.publish([AllBlocksCleared()])

    @staticmethod
    def _attach(sock: zmq.Socket[bytes], key: str, endpoint: str, *, bind: bool) -> None:
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
            # Only a starved publisher thread gets here. Wait rather than drop: a batch
            # missing from the stream would leave every consumer wrong for good.
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "KV event queue full (%d batches): the engine waits for the publisher",
                    self._queue.maxsize,
                )
            self._queue.put(item)
        self.next_seq = seq + 1
        self.num_events += len(events)
        return seq

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (up to `timeout`), then stop the thread and close the sockets."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("KV event publisher did not drain within %.1f s", timeout)
            return  # the daemon thread still owns the sockets; they go with the process
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close()
        if self._replay is not None:
            self._replay.close()

    # -- the publisher thread -----------------------------------------------------------------

    def _run(self) -> None:
        get = self._queue.get
        timeout = _REPLAY_POLL_S if self._replay is not None else None
        pub, topic, encode, buffer = self._pub, self._topic, self._encoder.encode, self._buffer
        while True:
            try:
                item = get(timeout=timeout)
            except queue.Empty:
                item = ()
            if self._replay is not None:
                self._serve_replays()
            if item is None:
                return
            if not item:
                continue
            seq, ts, events = item
            try:
                payload = encode(ts, events)
                pub.send_multipart((topic, seq_bytes(seq), payload))
            except Exception:
                # Keep the thread (and the sequence) alive; consumers see the gap and replay.
                logger.exception("KV event batch %d could not be published", seq)
                continue
            buffer.append((seq, payload))

    def _serve_replays(self) -> None:
        """Answer every waiting replay request: each buffered batch with seq >= start, then
        the end marker (REFERENCE.md §3 framing)."""
        replay = self._replay
        assert replay is not None
        while replay.poll(0):
            try:
                frames = replay.recv_multipart()
                identity = frames[0]
                if len(frames) == 3 and not frames[1] and len(frames[2]) == 8:
                    start = int.from_bytes(frames[2], "big")
                    for seq, payload in list(self._buffer):
                        if seq >= start:
                            replay.send_multipart(
                                (identity, b"", self._topic, seq_bytes(seq), payload)
                            )
                else:
                    logger.warning("malformed KV event replay request: %d frames", len(frames))
                replay.send_multipart((identity, b"", b"", END_SEQ, b""))
            except zmq.ZMQError:
                logger.exception("KV event replay failed")
