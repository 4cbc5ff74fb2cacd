"""Throwaway virtual environments for outside tools a test drives (routers, clients).

A tool lives in its own venv under `<repo>/.test-tools/<name>` (or `$MOCKER_TEST_TOOLS/<name>`),
built once: a stamp file records the requirement list it was built for, so a later run with
the same list reuses it and a changed list rebuilds it. When pip cannot install the tool
(no network, no wheel for this machine), the test is skipped with pip's own last words.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP = ".mocker-tool-stamp"
PIP_TIMEOUT = 600.0  # seconds, for `pip install` of one tool (wheels of ~30 MB)
VENV_TIMEOUT = 120.0


def tools_dir() -> Path:
    return Path(os.environ.get("MOCKER_TEST_TOOLS") or REPO / ".test-tools")


def base_python() -> str:
    """The interpreter the project's venv was made from (a venv's python would nest venvs)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if base and Path(base).exists() else shutil.which("python3") or sys.executable


def _key(requirements: list[str]) -> str:
    text = json.dumps({"python": sys.version_info[:2], "requirements": list(requirements)})
    return hashlib.sha256(text.encode()).hexdigest()


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def tool_venv(name: str, requirements: list[str]) -> Path:
    """The bin directory of a venv `name` with `requirements` pip-installed in it.

    Built once and reused while its stamp matches `requirements`; skips the calling test
    (loudly, with pip's last lines) if the venv cannot be made or pip cannot install them."""
    venv = tools_dir() / name
    bin_dir = venv / "bin"
    stamp = venv / STAMP
    key = _key(requirements)
    if stamp.is_file() and stamp.read_text().strip() == key and (bin_dir / "python").exists():
        return bin_dir
    what = " ".join(requirements)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [base_python(), "-m", "venv", str(venv)],
        VENV_TIMEOUT,
        f"could not create a venv for {what}",
    )
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-input", *requirements],
        PIP_TIMEOUT,
        f"could not install {what}",
    )  # fmt: skip
    stamp.write_text(key + "\n")
    return bin_dir


def _run(argv: list[str], timeout: float, failure: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        pytest.skip(f"{failure}: timed out after {timeout:.0f} s: {_tail(text)}")
    except OSError as exc:
        pytest.skip(f"{failure}: {exc}")
    if done.returncode != 0:
        pytest.skip(f"{failure}: {_tail(done.stdout + done.stderr)}")
