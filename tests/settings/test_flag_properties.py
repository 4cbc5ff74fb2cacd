"""Any flags, any values: `mocker serve` and `mocker replay` either run or stop with one line
naming the mistake and exit 2 (argparse's usage and error for what it refuses itself), never a
traceback, and never with memory sized by the values before they are checked."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker import cli
from mocker.settings import ENGINE_OPTIONS, SERVER_OPTIONS
from tests.support.nasty import EDGES, values

# What building every setting may take (the bundled tokenizer, a model's config): far less.
MEMORY_BOUND = 256 * 2**20
SERVE_FLAGS = sorted(o.flag for o in ENGINE_OPTIONS + SERVER_OPTIONS)
# replay's own flags, drawn more often than the engine's (which test_serve_flags covers).
REPLAY_ONLY = ("--num-requests", "--input-len", "--output-len", "--rate", "--time-scale",
               "--concurrency", "--num-engines", "--prefill-engines", "--trace-block-size",
               "--shared-prefix-fraction", "--num-prefixes", "--max-requests",
               "--length-distribution", "--router", "--max-model-len",
               "--num-gpu-blocks-override", "--block-size")  # fmt: skip
PROFILE = settings(max_examples=120, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


class _WouldServe(Exception):
    """Every setting was accepted: the server would bind its port now."""


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """('ran' | 'refused' | 'usage', stderr), the memory the attempt took bounded."""
    tracemalloc.start()
    try:
        try:
            code = cli.main(argv)
            kind = "ran" if code == 0 else f"exit {code}"
        except _WouldServe:
            kind = "ran"
        except SystemExit as exc:  # argparse's own refusal (usage, then the error)
            kind = "usage" if exc.code == 2 else f"exit {exc.code}"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert peak < MEMORY_BOUND, (argv, peak)
    return kind, err


def _check(kind: str, err: str, argv: list[str]) -> None:
    assert "Traceback" not in err, (argv, err)
    assert kind in ("ran", "exit 2", "usage"), (argv, kind, err)
    if kind == "exit 2":
        lines = [line for line in err.splitlines() if not line.startswith("mocker: warning")]
        assert lines and lines[-1].startswith("mocker: "), (argv, err)
        refusal = [line for line in lines if not line.startswith(("mocker: deployment",
                                                                    "mocker: timing"))]  # fmt: skip
        assert len(refusal) == 1, (argv, err)  # one line names the mistake


@PROFILE
@given(flags=st.lists(st.tuples(st.sampled_from(SERVE_FLAGS), values), min_size=1, max_size=3))
def test_serve_flags(
    flags: list[tuple[str, str]], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    def would_serve(*_: object) -> None:
        raise _WouldServe

    monkeypatch.setattr(cli, "_listeners", would_serve)
    argv = ["serve", "--model", "mocker", "--timing-model", "polynomial"]
    for flag, value in flags:
        argv += [flag, value]
    kind, err = _outcome(argv, capsys)
    _check(kind, err, argv)


@PROFILE
@given(
    flags=st.lists(
        st.tuples(st.sampled_from(REPLAY_ONLY), st.sampled_from(EDGES) | values),
        min_size=1,
        max_size=3,
    )
)
def test_replay_flags(
    flags: list[tuple[str, str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["replay", "--synthetic", "--num-requests", "4", "--input-len", "32",
            "--output-len", "2", "--model", "mocker", "--timing-model", "polynomial",
            "--output-dir", str(tmp_path / "out"), "--quiet", "--no-plots"]  # fmt: skip
    for flag, value in flags:
        if flag == "--num-requests" and value.strip().isdigit() and 64 < int(value) <= 10**6:
            value = "64"  # a valid workload this large only takes long: not the point here
        argv += [flag, value]
    kind, err = _outcome(argv, capsys)
    _check(kind, err, argv)
