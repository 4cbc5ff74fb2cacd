"""The sweep's finished points on disk: one JSON file a point, so a rerun skips them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mocker.sweep.point import Outcome

__all__ = ["PointStore"]


class PointStore:
    """`DIR/points/KEY.json`: a finished point's outcome (written whole or not at all);
    `KEY.log`: what its worker printed."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir / "points"
        self.dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, key: str) -> Path:
        return self.dir / f"{key}.log"

    def save_error(self, key: str, reason: str) -> None:
        """Why a worker gave the point up (read by the driver, never reused)."""
        (self.dir / f"{key}.error").write_text(reason, encoding="utf-8")

    def take_error(self, key: str) -> str | None:
        """The reason a worker left for the point, removed; None if it left none."""
        path = self.dir / f"{key}.error"
        try:
            reason = path.read_text(encoding="utf-8")
        except OSError:
            return None
        path.unlink(missing_ok=True)
        return reason

    def load(self, key: str) -> Outcome | None:
        """The point's finished outcome, or None (never run, or a file cut short)."""
        try:
            outcome = json.loads((self.dir / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return outcome if isinstance(outcome, dict) and "summary" in outcome else None

    def forget(self, key: str) -> None:
        """Drop what is filed under `key` (a file cut short, about to be run again)."""
        (self.dir / f"{key}.json").unlink(missing_ok=True)

    def save(self, key: str, outcome: Outcome) -> None:
        """File a finished outcome, unless it is filed (a local worker files its own); a
        failure is not filed: a rerun tries it again."""
        path = self.dir / f"{key}.json"
        if "summary" not in outcome or path.exists():
            return
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(outcome, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)  # a reader sees the old file or the whole new one
