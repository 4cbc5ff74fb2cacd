"""The compiled parts: the one place each C module is imported, and the one switch that says
which serve.

Each part is a C module beside the Python code that is its reference and its spec (the
part's module says which); a part that was not built (no C compiler at install) leaves the
Python code to serve. `MOCKER_COMPILED` chooses: `auto` (the default: every part that was
built), `0` (none: the Python code everywhere) or `1` (every part, and an error at start-up
when one was not built). `MOCKER_COMPILED_SKIP` names parts to leave out all the same (`_cpool`,
`_clink`, ...: what a part buys is measured with and without it, bench/compiled_parts.py).
A caller may force a part on or off (tests compare the two).
"""

from __future__ import annotations

import importlib
import os
from enum import StrEnum
from types import ModuleType
from typing import TYPE_CHECKING

from mocker.errors import ConfigError

__all__ = [
    "ENV",
    "PARTS",
    "SKIP_ENV",
    "Mode",
    "built",
    "chash",
    "clink",
    "clru",
    "cpass",
    "cpool",
    "cprompts",
    "ctext",
    "mode",
    "use_compiled",
]

ENV = "MOCKER_COMPILED"
SKIP_ENV = "MOCKER_COMPILED_SKIP"


class Mode(StrEnum):
    AUTO = "auto"
    OFF = "0"
    ON = "1"


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # built without a C compiler: the Python code serves
        return None


if TYPE_CHECKING:
    from mocker.api import _ctext as ctext
    from mocker.engine import _cpass as cpass
    from mocker.kv import _chash as chash
    from mocker.kv import _cpool as cpool
    from mocker.replay import _cprompts as cprompts
    from mocker.tiers import _clink as clink
    from mocker.tiers import _clru as clru
else:
    cpool = _load("mocker.kv._cpool")
    chash = _load("mocker.kv._chash")
    cpass = _load("mocker.engine._cpass")
    ctext = _load("mocker.api._ctext")
    cprompts = _load("mocker.replay._cprompts")
    clru = _load("mocker.tiers._clru")
    clink = _load("mocker.tiers._clink")

# Every part by its module name (None: not built).
PARTS: dict[str, ModuleType | None] = {
    "mocker.kv._cpool": cpool,
    "mocker.kv._chash": chash,
    "mocker.engine._cpass": cpass,
    "mocker.api._ctext": ctext,
    "mocker.replay._cprompts": cprompts,
    "mocker.tiers._clru": clru,
    "mocker.tiers._clink": clink,
}


def built(name: str) -> bool:
    """Whether the part `name` (its module's name) was built."""
    return PARTS[name] is not None


def mode() -> Mode:
    """The switch as set now (read at each call: an engine made later may see another)."""
    raw = os.environ.get(ENV, Mode.AUTO.value).strip().lower() or Mode.AUTO.value
    try:
        chosen = Mode(raw)
    except ValueError:
        choices = ", ".join(m.value for m in Mode)
        raise ConfigError(f"{ENV}={raw!r}: expected one of {choices}") from None
    if chosen is Mode.ON:
        missing = [name for name, part in PARTS.items() if part is None]
        if missing:
            raise ConfigError(
                f"{ENV}=1, but {', '.join(missing)} {'was' if len(missing) == 1 else 'were'} "
                "not built (no C compiler when mocker was installed?): reinstall with one, "
                "or use auto / 0"
            )
    return chosen


def skipped() -> frozenset[str]:
    """The parts MOCKER_COMPILED_SKIP leaves out, by module name (an unknown name: an error)."""
    raw = os.environ.get(SKIP_ENV, "")
    names = {part.strip() for part in raw.split(",") if part.strip()}
    by_short = {name.rsplit(".", 1)[-1]: name for name in PARTS}
    unknown = sorted(n for n in names if n not in by_short and n not in PARTS)
    if unknown:
        choices = ", ".join(sorted(by_short))
        raise ConfigError(f"{SKIP_ENV}: unknown part {', '.join(unknown)}: expected {choices}")
    return frozenset(by_short.get(n, n) for n in names)


def use_compiled(name: str, compiled: bool | None = None) -> bool:
    """Whether the part `name` serves: `compiled` None: as the switch says; True: yes (an
    error if it was not built); False: no."""
    if compiled is None:
        return built(name) and mode() is not Mode.OFF and name not in skipped()
    if compiled and not built(name):
        raise RuntimeError(f"{name} was not built (no C compiler?)")
    return compiled
