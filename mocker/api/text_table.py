"""Streamed token chunks framed for the socket from a table of token texts (C, or this reference).

A plain streamed chunk is `head + text + tail`, written to uvicorn's transport framed as a
chunked body's chunk: `<hex length>\\r\\n<chunk>\\r\\n` (mocker/api/direct_write.py). With the
compiled table (mocker/api/_ctext.c) the whole framed chunk is one allocation from one
compact buffer of texts, where the Python way looks the text up in a dict of bytes objects
(~2.5 MB for the default tokenizer, a cache miss per randomly drawn token) and joins four
pieces. `TextTable` below is the reference: the same answers, entry for entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from mocker.compiled import ctext as _ctext
from mocker.compiled import use_compiled

__all__ = ["MAX_ID", "MAX_TEXT", "FramedTable", "SinkFactory", "TextTable", "sinks", "text_table"]


MAX_TEXT = 255  # longer texts are left out of the table (they go the Python way)
MAX_ID = 2**24  # so are ids from here on


class FramedTable(Protocol):
    """What the renderer asks of a table (the compiled one or `TextTable`)."""

    def framed(self, token_id: int, head: bytes, tail: bytes, /) -> bytes | None: ...

    def text(self, token_id: int, /) -> bytes | None: ...

    def __len__(self) -> int: ...


class TextTable:
    """Token texts by id, and chunks framed around them; None for an id not in the table."""

    __slots__ = ("_texts",)

    def __init__(self, pieces: Mapping[int, bytes]) -> None:
        if not isinstance(pieces, dict):
            raise TypeError("TextTable: pieces must be a dict")
        if not all(isinstance(k, int) for k in pieces) or not all(
            isinstance(v, bytes) for v in pieces.values()
        ):
            raise TypeError("TextTable: pieces must map ints to bytes")
        self._texts = {
            int(k): v for k, v in pieces.items() if 0 <= k < MAX_ID and len(v) <= MAX_TEXT
        }
        if sum(map(len, self._texts.values())) + 1 > 2**24 - 1:
            raise ValueError("TextTable: the texts exceed 16 MB")

    def framed(self, token_id: int, head: bytes, tail: bytes, /) -> bytes | None:
        if (
            not isinstance(token_id, int)
            or not isinstance(head, bytes)
            or not isinstance(tail, bytes)
        ):
            raise TypeError("framed() takes an int and two bytes")
        text = self._texts.get(token_id)
        if text is None:
            return None
        chunk = head + text + tail
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)

    def text(self, token_id: int, /) -> bytes | None:
        if not isinstance(token_id, int):
            raise TypeError("text() takes an int")
        return self._texts.get(token_id)

    def __len__(self) -> int:
        return len(self._texts)


def text_table(pieces: Mapping[int, bytes], compiled: bool | None = None) -> FramedTable | None:
    """The compiled table of `pieces` (a snapshot: later entries are not in it), or None when
    the renderer is to join chunks in Python (not built, MOCKER_COMPILED=0, or
    `compiled=False`). `compiled=True`: the compiled table or an error."""
    if not use_compiled("mocker.api._ctext", compiled):
        return None
    return _ctext.TextTable(dict(pieces))


# sink(head, tail, emitter, direct, cycle, choice): a TokenSink (mocker.engine.stream) writing a
# response's plain chunks from the engine loop's hand-out (StreamRenderer._attach_sink).
SinkFactory = Callable[[bytes, bytes, Any, Any, Any, Any], Callable[[int], bool]]


def sinks(table: FramedTable | None) -> SinkFactory | None:
    """The sink maker of the compiled table (mocker/api/_ctext.c's Sink, which writes what
    the renderer's framed path writes, from C); None for any other table or none, whose
    chunks the renderer writes itself (its Python path is the sink's reference)."""
    if _ctext is None or not isinstance(table, _ctext.TextTable):
        return None
    return partial(_ctext.Sink, table)
