"""text_table: the compiled table of token texts answers as its Python reference, and frames a
chunk exactly as uvicorn frames a body chunk."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mocker import compiled
from mocker.api import text_table as tt
from mocker.api.text_table import MAX_ID, MAX_TEXT, TextTable, text_table
from mocker.compiled import ctext as _ctext

needs_c = pytest.mark.skipif(_ctext is None, reason="mocker.api._ctext was not built")


def _tables(pieces: dict[int, bytes]) -> list[Any]:
    """The reference, and the compiled table when it was built."""
    tables: list[Any] = [TextTable(pieces)]
    if _ctext is not None:
        tables.append(_ctext.TextTable(pieces))
    return tables


def _random_pieces(rng: random.Random) -> dict[int, bytes]:
    pieces: dict[int, bytes] = {}
    for _ in range(rng.randrange(0, 300)):
        tok = rng.choice([rng.randrange(0, 200_000), rng.randrange(0, 20), MAX_ID - 1, MAX_ID,
                          -rng.randrange(1, 5), 2**70])  # fmt: skip
        size = rng.choice([0, 1, rng.randrange(0, 40), MAX_TEXT, MAX_TEXT + 1, 300])
        pieces[tok] = bytes(rng.randrange(256) for _ in range(size))
    return pieces


def _uvicorn_frame(chunk: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(chunk), chunk)


@pytest.mark.parametrize("seed", range(40))
def test_compiled_and_reference_answer_alike(seed: int) -> None:
    rng = random.Random(seed)
    pieces = _random_pieces(rng)
    tables = _tables(pieces)
    kept = {k: v for k, v in pieces.items() if 0 <= k < MAX_ID and len(v) <= MAX_TEXT}
    probes = [*pieces, *(rng.randrange(-10, 250_000) for _ in range(200)), 2**64, -(2**70)]
    # Heads and tails whose sums cross the frame's hex-digit boundaries (15/16, 255/256...).
    sizes = [0, 1, 14, 15, 16, 200, 255, 256, 4095, 4096, 70_000]
    for table in tables:
        assert len(table) == len(kept)
        for tok in probes:
            head = b"h" * rng.choice(sizes)
            tail = bytes(rng.randrange(256) for _ in range(rng.choice(sizes[:6])))
            text = kept.get(tok)
            assert table.text(tok) == text
            framed = table.framed(tok, head, tail)
            assert framed == (None if text is None else _uvicorn_frame(head + text + tail))


def test_the_table_is_a_snapshot_of_its_pieces() -> None:
    pieces = {5: b" five"}
    tables = _tables(pieces)
    pieces[6] = b" six"
    pieces[5] = b" changed"
    for table in tables:
        assert table.text(5) == b" five" and table.text(6) is None and len(table) == 1


@pytest.mark.parametrize(
    "args",
    [
        (1.0, b"", b""),  # a float id
        ("1", b"", b""),
        (1, "head", b""),  # str, not bytes
        (1, b"", bytearray(b"t")),
    ],
)
def test_bad_arguments_are_refused_alike(args: tuple[Any, ...]) -> None:
    for table in _tables({1: b"one"}):
        with pytest.raises(TypeError):
            table.framed(*args)


@pytest.mark.parametrize("token_id", [1.0, "1", None])
def test_text_takes_an_int(token_id: Any) -> None:
    for table in _tables({1: b"one"}):
        with pytest.raises(TypeError):
            table.text(token_id)


@pytest.mark.parametrize("pieces", [{"1": b"one"}, {1: "one"}, {1: bytearray(b"one")}])
def test_only_int_to_bytes_pieces_make_a_table(pieces: Any) -> None:
    for build in [TextTable, *([_ctext.TextTable] if _ctext is not None else [])]:
        with pytest.raises(TypeError):
            build(pieces)


@needs_c
def test_text_table_serves_the_compiled_one_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MOCKER_COMPILED", raising=False)
    table = text_table({3: b" three"})
    assert table is not None and type(table).__module__ == "mocker.api._ctext"
    assert table.framed(3, b"a", b"b") == _uvicorn_frame(b"a three" + b"b")
    assert text_table({3: b" three"}, compiled=False) is None
    monkeypatch.setenv("MOCKER_COMPILED", "0")
    assert text_table({3: b" three"}) is None  # every compiled part off: joined in Python


def test_text_table_without_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(compiled.PARTS, "mocker.api._ctext", None)
    assert text_table({1: b"x"}) is None
    with pytest.raises(RuntimeError, match="not built"):
        text_table({1: b"x"}, compiled=True)


# -- the sink: a response's plain chunks written from the engine loop's hand-out ----------------


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.broken = False

    def write(self, data: bytes) -> None:
        if self.broken:
            raise RuntimeError("the transport is closed")
        self.written.append(data)


class _Flow:
    write_paused = False


class _Cycle:
    def __init__(self) -> None:
        self.transport = _Transport()
        self.flow = _Flow()
        self.disconnected = False
        self.response_complete = False


class _Emitter:
    __slots__ = ("writer",)
    writer: object


class _Choice:
    completion_tokens = 5


def _sink(table: Any) -> tuple[Any, _Cycle, _Emitter, _Choice]:
    cycle, emitter, choice = _Cycle(), _Emitter(), _Choice()
    direct = object()
    emitter.writer = direct
    maker = tt.sinks(table)
    assert maker is not None
    return maker(b"<", b">", emitter, direct, cycle, choice), cycle, emitter, choice


@needs_c
def test_a_sink_writes_the_framed_chunk_and_counts_it() -> None:
    table = text_table({7: b" seven", 8: b""}, compiled=True)
    assert table is not None  # (compiled=True: the table or an error)
    sink, cycle, _emitter, choice = _sink(table)
    assert sink(7) is True and sink(8) is True
    assert cycle.transport.written == [table.framed(7, b"<", b">"), table.framed(8, b"<", b">")]
    assert cycle.transport.written[0] == b"8\r\n< seven>\r\n"
    assert choice.completion_tokens == 7


def _refusals() -> list[tuple[str, Any]]:
    def paused(c: _Cycle, e: _Emitter) -> None:
        c.flow.write_paused = True

    def disconnected(c: _Cycle, e: _Emitter) -> None:
        c.disconnected = True

    def complete(c: _Cycle, e: _Emitter) -> None:
        c.response_complete = True

    def queued(c: _Cycle, e: _Emitter) -> None:
        e.writer = None  # a blocked send: later chunks queue behind it

    def broken(c: _Cycle, e: _Emitter) -> None:
        c.transport.broken = True

    return [(f.__name__, f) for f in (paused, disconnected, complete, queued, broken)]


@needs_c
@pytest.mark.parametrize(("why", "change"), _refusals())
def test_a_sink_refuses_what_the_renderer_must_take(why: str, change: Any) -> None:
    """As DirectBody.write_framed declines (a pause, a disconnect, the response over), or the
    emitter queues (a blocked send), or the write raises: nothing written, nothing counted."""
    sink, cycle, emitter, choice = _sink(text_table({7: b" seven"}, compiled=True))
    change(cycle, emitter)
    assert sink(7) is False, why
    assert cycle.transport.written == [] and choice.completion_tokens == 5


class _PlainFlow:
    def __init__(self) -> None:
        self.write_paused = False  # an instance attribute, as uvicorn's FlowControl has


def _flag_property(name: str) -> Any:
    return property(
        lambda self: self.flags[name], lambda self, value: self.flags.__setitem__(name, value)
    )


class _PropertyCycle(_Cycle):
    """A cycle whose flags are descriptors: the sink must ask them, not an instance dict."""

    disconnected = _flag_property("disconnected")
    response_complete = _flag_property("response_complete")

    def __init__(self) -> None:
        self.flags = {"disconnected": False, "response_complete": False}
        super().__init__()


@needs_c
@pytest.mark.parametrize(("why", "change"), [r for r in _refusals() if r[0] != "broken"])
@pytest.mark.parametrize("cycle_type", [_Cycle, _PropertyCycle])
@pytest.mark.parametrize("flow_type", [_Flow, _PlainFlow])
def test_a_sink_sees_a_flag_set_between_its_writes(
    why: str, change: Any, cycle_type: type[_Cycle], flow_type: type[Any]
) -> None:
    """The flags are read at every token, and whenever they change, whether they are plain
    instance attributes (as uvicorn's) or descriptors."""
    table = text_table({7: b" seven"}, compiled=True)
    cycle, emitter, choice = cycle_type(), _Emitter(), _Choice()
    cycle.flow = flow_type()
    emitter.writer = direct = object()
    maker = tt.sinks(table)
    assert maker is not None
    sink = maker(b"<", b">", emitter, direct, cycle, choice)
    assert sink(7) is True and sink(7) is True
    change(cycle, emitter)
    assert sink(7) is False, why
    assert len(cycle.transport.written) == 2 and choice.completion_tokens == 7


@needs_c
@pytest.mark.parametrize("token", [11, -1, 2**70, "7", 7.0])
def test_a_sink_refuses_a_token_outside_the_table(token: Any) -> None:
    sink, cycle, _emitter, choice = _sink(text_table({7: b" seven"}, compiled=True))
    assert sink(token) is False
    assert cycle.transport.written == [] and choice.completion_tokens == 5


@needs_c
def test_a_sink_takes_one_token_id_and_a_cycle_with_a_transport() -> None:
    sink, *_ = _sink(text_table({7: b" seven"}, compiled=True))
    with pytest.raises(TypeError, match="one token id"):
        sink(7, 8)
    with pytest.raises(TypeError, match="one token id"):
        sink(token=7)
    table = text_table({7: b" seven"}, compiled=True)
    assert isinstance(table, _ctext.TextTable)
    with pytest.raises(AttributeError):
        _ctext.Sink(table, b"", b"", _Emitter(), None, object(), _Choice())
    with pytest.raises(TypeError):  # the Python table, where a Sink needs the compiled one
        _ctext.Sink(TextTable({}), b"", b"", _Emitter(), None, _Cycle(), _Choice())  # type: ignore[arg-type]


def test_only_the_compiled_table_makes_sinks() -> None:
    assert tt.sinks(None) is None and tt.sinks(TextTable({7: b" seven"})) is None
    compiled = text_table({7: b" seven"})
    assert (tt.sinks(compiled) is not None) == (compiled is not None)
