"""Stop strings matched in generated text as it streams: pure, no engine or HTTP."""

from __future__ import annotations

__all__ = ["StopMatcher"]


class StopMatcher:
    """Finds the first stop string in a choice's text as tokens arrive, and says how much
    text may go out so far.

    Text that could still be the start of a stop string is held back until it is decided
    (at most the longest stop string's length minus one character). On a match the text
    ends before the stop string, or after it with `include_stop`.
    """

    __slots__ = ("_hold", "include_stop", "sent", "stops", "text")

    def __init__(self, stops: tuple[str, ...], *, include_stop: bool = False) -> None:
        if not stops or any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = stops
        self.include_stop = include_stop
        self._hold = max(len(s) for s in stops) - 1
        self.text = ""  # everything generated so far (cut at the stop string once matched)
        self.sent = 0  # characters of `text` already handed out

    def feed(self, new: str, *, final: bool = False) -> tuple[str, str | None]:
        """Add newly generated text; returns (text to hand out now, the stop string matched
        or None). After a match, or with `final` (the request ended), nothing is held."""
        start = max(0, len(self.text) - self._hold)  # a match may begin in held-back text
        self.text += new
        hit: tuple[int, str] | None = None
        for s in self.stops:
            pos = self.text.find(s, start)
            if pos >= 0 and (hit is None or pos < hit[0]):
                hit = (pos, s)
        if hit is not None:
            pos, s = hit
            self.text = self.text[: pos + len(s)] if self.include_stop else self.text[:pos]
            emit_to = len(self.text)
        elif final:
            emit_to = len(self.text)
        else:
            emit_to = max(self.sent, len(self.text) - self._hold)
        out, self.sent = self.text[self.sent : emit_to], emit_to
        return out, None if hit is None else hit[1]
