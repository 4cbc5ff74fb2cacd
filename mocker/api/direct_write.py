"""Streamed body chunks written straight to uvicorn's transport, framed exactly as it frames them.

uvicorn's ASGI `send` for a body chunk of a chunked response checks the cycle's state, frames
the chunk (`<hex length>\\r\\n<chunk>\\r\\n`) and writes it to the transport. Through the
coroutine protocol that costs a message dict, a coroutine, and a StopIteration per token: about
a third of the Python work of streaming one token. `DirectBody` does the same write with the
same checks for the common case (the connection open, its buffer not over the high-water mark)
and says no otherwise, so flow control, the last chunk (which ends the response and decides
keep-alive) and every other server go through `send` as before.
These are uvicorn's own attributes, not an interface it promises: pyproject.toml pins uvicorn
to the range the tests prove (tests/api/test_direct_write.py fails if the cycle stops looking
the way this assumes; tools/check-interpreters.sh runs it on the range's lowest version, the
suite on its newest), and a cycle that lacks one is left to its `send`.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

__all__ = ["DirectBody", "direct_body"]


def _cycle_types() -> tuple[type, ...]:
    """uvicorn's HTTP/1.1 cycle classes whose body framing `DirectBody` reproduces."""
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:  # httptools missing: uvicorn runs h11, whose send is used as is
        return ()
    return (RequestResponseCycle,)


_CYCLES = _cycle_types()

# What `direct_body` and `DirectBody` read of a cycle: instance attributes of uvicorn's
# (checked on a cycle of each type once; a uvicorn that renamed one is left to its `send`).
_READS = ("chunked_encoding", "disconnected", "flow", "response_complete", "response_started",
          "scope", "transport")  # fmt: skip
_COMPATIBLE: dict[type, bool] = {}

# The frame heads (`<hex length>\r\n`) of chunks shorter than this, as uvicorn writes them.
_FRAMED = 4096
_HEADS = [b"%x\r\n" % n for n in range(_FRAMED)]


class DirectBody:
    """Writes body chunks of one started, chunked response to its transport."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle

    @property
    def cycle(self) -> Any:
        """uvicorn's cycle it writes for (a sink reads its state: mocker/api/_ctext.c)."""
        return self._cycle

    def write(self, chunk: bytes) -> bool:
        """Frame and write a non-final chunk; False (nothing written) when `send` must take it:
        the client has gone, the transport asked to pause, or the response has ended."""
        cycle = self._cycle
        if cycle.disconnected or cycle.flow.write_paused or cycle.response_complete:
            return False
        n = len(chunk)
        if n < _FRAMED:  # (a token chunk: its frame's head looked up, not formatted)
            if n:  # an empty chunk frames to nothing (its frame would end the body)
                cycle.transport.write(_HEADS[n] + chunk + b"\r\n")
        else:
            cycle.transport.write(b"%x\r\n%b\r\n" % (n, chunk))
        return True

    def write_framed(self, framed: bytes) -> bool:
        """`write` of a chunk framed already (mocker/api/text_table.py), never an empty one
        (whose frame would end the body); False (nothing written) as `write` says."""
        cycle = self._cycle
        if cycle.disconnected or cycle.flow.write_paused or cycle.response_complete:
            return False
        cycle.transport.write(framed)
        return True


def direct_body(send: Send) -> DirectBody | None:
    """A `DirectBody` for a response whose start `send` has written, if `send` is uvicorn's
    httptools cycle and the body is chunked (not a HEAD, no content-length); else None."""
    cycle: Any = getattr(send, "__self__", None)
    if cycle is None or type(cycle) not in _CYCLES:
        return None
    compatible = _COMPATIBLE.get(type(cycle))
    if compatible is None:
        flow = getattr(cycle, "flow", None)
        compatible = _COMPATIBLE[type(cycle)] = all(
            hasattr(cycle, name) for name in _READS
        ) and hasattr(flow, "write_paused")
    if not compatible:
        return None
    if not cycle.response_started or cycle.chunked_encoding is not True:
        return None
    if cycle.scope.get("method") == "HEAD":
        return None
    return DirectBody(cycle)
