"""Graceful shutdown: SIGTERM drains (503 for new work and /health), aborts stragglers, exits."""

from __future__ import annotations

import logging
import time
from types import FrameType

import uvicorn

from mocker.api.state import ServerState

__all__ = ["DrainingServer"]

# uvicorn's logger: these lines sit among its own start-up and shutdown lines.
logger = logging.getLogger("uvicorn.error")


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain before its own shutdown.

    The first SIGTERM/SIGINT only sets a flag (as uvicorn's own handler does). The server's
    main loop, which ticks every 0.1 s, then marks the app draining: completions and
    /health answer 503, so a router stops sending, while the listener stays open and
    in-flight requests go on. When none is left, or `shutdown_timeout` has passed (the
    rest are then aborted: streams end with a 503 error event and [DONE]), uvicorn's
    normal shutdown runs. A second signal skips the drain.
    """

    def __init__(self, config: uvicorn.Config, *states: ServerState) -> None:
        super().__init__(config)
        self.states = states  # one a replica (`mocker serve --replicas N`)
        self.drain_requested = False
        self._deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested:
            super().handle_exit(sig, frame)
        self.drain_requested = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested and not self.should_exit:
            self._drain()
        return await super().on_tick(counter)

    def _drain(self) -> None:
        states, now = self.states, time.monotonic()
        if self._deadline is None:
            for state in states:
                state.draining = True
            self._deadline = now + states[0].settings.shutdown_timeout
            logger.info(
                "draining: %d requests in flight, up to %.1f s; new requests get 503",
                sum(state.in_flight for state in states),
                states[0].settings.shutdown_timeout,
            )
        # A response can outlive its engine request (output held back by jitter).
        if not any(s.engines.num_open_streams or s.in_flight for s in states):
            logger.info("drained; shutting down")
            self.should_exit = True
        elif now >= self._deadline:
            aborted = sum(state.engines.abort_all() for state in states)
            logger.info("shutdown timeout: aborting %d requests", aborted)
            for state in states:
                state.faults.release_all()  # held output goes out now, before connections close
            self.should_exit = True
