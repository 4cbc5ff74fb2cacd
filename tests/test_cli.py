"""The command line: the demo runs the live engine; bad settings exit 2 with a message."""

import pytest

from mocker.cli import main


def test_demo_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["demo", "--num-requests", "4", "--concurrency", "2", "--speedup-ratio", "100"]) == 0
    )
    out = capsys.readouterr().out
    assert "4 requests, 256 tokens" in out and "TTFT median" in out


def test_bad_setting_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--speedup-ratio", "0"]) == 2
    assert "speedup_ratio" in capsys.readouterr().err
    assert main(["demo", "--timing-profile", "/nonexistent.npz"]) == 2
    assert "timing_profile" in capsys.readouterr().err
