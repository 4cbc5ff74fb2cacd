"""What a finished point is filed under: everything that can change its result (mocker's
code, the GPU data's version, the trace's content, the flags and the files they name)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import mocker
from mocker import __version__
from mocker.errors import ConfigError

__all__ = ["file_digest", "point_key"]

# A model folder's files that shape a replay (the architecture, the quantization).
_MODEL_FILES = ("config.json", "hf_quant_config.json")


def file_digest(path: Path) -> str:
    """A file's SHA-256, read in chunks (a ConfigError if it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()


@cache
def _code() -> str:
    """mocker's own source and the GPU data's version: a point filed by other code (an
    upgrade, or an edit of a checkout) is run again."""
    digest = hashlib.sha256(__version__.encode())
    root = Path(mocker.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c", ".h", ".yaml", ".json", ".jinja") and path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    with contextlib.suppress(metadata.PackageNotFoundError):
        digest.update(metadata.version("aiconfigurator-core").encode())
    return digest.hexdigest()


def _contents(value: Any) -> str | None:
    """The digest of the file (or a model folder's config) a flag's value names, if any."""
    if not isinstance(value, str) or not value or len(value) > 4096:
        return None
    path = Path(value).expanduser()
    try:
        if path.is_file():
            return file_digest(path)
        if path.is_dir():
            found = [path / n for n in _MODEL_FILES if (path / n).is_file()]
            return ",".join(file_digest(f) for f in found) or None
    except OSError:
        return None
    return None


def point_key(trace_digest: str | None, flags: dict[str, Any]) -> str:
    """The key of a point: a trace's content, not its path (a moved trace keeps its points);
    a flag's file by its content too."""
    files = {name: d for name, value in flags.items() if (d := _contents(value)) is not None}
    identity = {"code": _code(), "trace": trace_digest, "flags": flags, "files": files}
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
