"""A generation response from acceptance to its end: counted for the drain, ended on disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from mocker.api.choice import Choice

__all__ = ["OpenResponse", "OpenResponses"]


class OpenResponses:
    """How many generation responses have been accepted and not yet ended: what a drain
    waits for (output held back by jitter can outlive the engine request)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class OpenResponse:
    """One accepted generation response. `on_disconnect` runs when the client leaves and
    again when the response ends either way: it ends the choices' engine requests (a no-op
    for finished ones) and is counted once."""

    __slots__ = ("_open", "arrived", "choices", "disconnected", "gone")

    def __init__(self, choices: Sequence[Choice], open_responses: OpenResponses) -> None:
        self.choices = choices
        self.arrived = asyncio.get_running_loop().time()
        self.gone = asyncio.Event()  # the client left: a held (jittered) response stops waiting
        self.disconnected = False
        self._open = open_responses
        open_responses.count += 1

    def on_disconnect(self) -> None:
        if not self.disconnected:
            self._open.count -= 1
        self.disconnected = True
        self.gone.set()
        for choice in self.choices:
            choice.cancel()
