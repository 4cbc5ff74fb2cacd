"""Parsing what servers send: server-sent event streams and Prometheus text pages."""

from __future__ import annotations

import json
import re
from typing import Any


def sse_events(body: str) -> list[Any]:
    """The `data:` payloads of an event stream, JSON-decoded ('[DONE]' kept as a string)."""
    assert body.endswith("\n\n"), body[-200:]
    events: list[Any] = []
    for block in body.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label pairs: value} of one metric in a Prometheus text page."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m[1])))
            out[labels] = float(m[2])
    return out
