"""The compiled parts' switch: which part serves, and a bad or impossible choice named."""

from __future__ import annotations

import pytest

from mocker import compiled
from mocker.compiled import ENV, SKIP_ENV, Mode, mode, use_compiled
from mocker.config import ConfigError, EngineConfig
from mocker.engine.kv_stack import build_kv_stack
from mocker.kv.block_pool import BlockPool


def test_every_part_is_imported_in_one_place() -> None:
    assert set(compiled.PARTS) == {
        "mocker.kv._cpool", "mocker.kv._chash", "mocker.engine._cpass", "mocker.api._ctext",
        "mocker.replay._cprompts", "mocker.tiers._clru", "mocker.tiers._clink",
    }  # fmt: skip


def test_a_part_serves_when_built_and_not_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(compiled.PARTS, "built", compiled)  # (any module stands for a part)
    monkeypatch.setitem(compiled.PARTS, "missing", None)
    monkeypatch.setenv(ENV, "auto")
    assert use_compiled("built") and not use_compiled("missing")
    assert use_compiled("built", True) and not use_compiled("built", False)
    with pytest.raises(RuntimeError, match="missing was not built"):
        use_compiled("missing", True)
    monkeypatch.setenv(ENV, "0")
    assert not use_compiled("built") and use_compiled("built", True)


def test_a_part_can_be_left_out_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(compiled.PARTS, "mocker.x._cone", compiled)
    monkeypatch.setitem(compiled.PARTS, "mocker.x._ctwo", compiled)
    monkeypatch.setenv(ENV, "auto")
    monkeypatch.setenv(SKIP_ENV, " _cone, ")
    assert not use_compiled("mocker.x._cone") and use_compiled("mocker.x._ctwo")
    assert use_compiled("mocker.x._cone", True)  # (a caller's choice wins)
    monkeypatch.setenv(SKIP_ENV, "mocker.x._ctwo")
    assert use_compiled("mocker.x._cone") and not use_compiled("mocker.x._ctwo")
    monkeypatch.setenv(SKIP_ENV, "_cthree")
    with pytest.raises(ConfigError, match=r"MOCKER_COMPILED_SKIP: unknown part _cthree"):
        use_compiled("mocker.x._cone")


def test_the_env_chooses_and_a_bad_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert mode() is Mode.AUTO
    monkeypatch.setenv(ENV, " 0 ")
    assert mode() is Mode.OFF
    monkeypatch.setenv(ENV, "python")
    with pytest.raises(ConfigError, match=r"MOCKER_COMPILED='python': expected one of auto, 0, 1"):
        mode()
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setitem(compiled.PARTS, "mocker.kv._cpool", None)
    with pytest.raises(ConfigError, match=r"MOCKER_COMPILED=1, but mocker.kv._cpool was not built"):
        mode()
    monkeypatch.setenv(ENV, "auto")
    assert mode() is Mode.AUTO
    stack = build_kv_stack(EngineConfig(), lambda n: 1.0)
    assert isinstance(stack.pool, BlockPool)  # not built: the Python pool serves
