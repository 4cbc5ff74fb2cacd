"""vLLM 0.34's tiering `secondary_tiers` entries (fs, obj) as tier specifications, and the
checks every connector key shares."""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mocker.config import ConfigError
from mocker.storage_spec import StorageKind, StorageTierSpec

__all__ = ["STORAGE_DEFAULTS", "UNBOUNDED_BLOCKS", "config_error", "number", "secondary_tier"]

# Per secondary tier: the mock's keys (sizes and links: vLLM has none), and vLLM 0.34's own
# keys of the fs and obj tiers that mean nothing here (and older spellings).
_TIER_KEYS = {"type", "capacity_bytes", "read_gbps", "write_gbps", "latency_ms", "failure_rate",
              "root_dir", "enable_kv_events"}  # fmt: skip
_TIER_IGNORED = {"module_path", "locality", "backpressure",
                 "n_read_threads", "n_write_threads", "store_config", "prefix", "io_threads",
                 "num_threads", "num_read_threads", "num_write_threads", "read_threads",
                 "write_threads", "bucket", "endpoint"}  # fmt: skip
# vLLM 0.34's tier types mocker does not model.
_UNMODELLED_TIERS = ("example", "p2p", "kvcr")
# An obj tier without capacity_bytes: as good as unbounded (the most blocks a tier takes).
UNBOUNDED_BLOCKS = 1 << 40

# The mock's defaults per tier type (GB/s = 10^9 bytes/s; latency per transfer): a local
# NVMe drive and a networked object store.
STORAGE_DEFAULTS: dict[StorageKind, dict[str, float]] = {
    StorageKind.FS: {"read_gbps": 8.0, "write_gbps": 4.0, "latency_ms": 0.1},
    StorageKind.OBJ: {"read_gbps": 2.0, "write_gbps": 1.0, "latency_ms": 5.0},
}


def config_error(key: str, value: Any, why: str) -> ConfigError:
    """The error naming a kv_transfer_config key, its value and what is wrong with it."""
    return ConfigError(f"invalid kv_transfer_config {key}={value!r}: {why}")


def number(key: str, value: Any, *, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 if `positive`), or the error naming its key."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise config_error(key, value, "must be a number")
    if not math.isfinite(value):
        raise config_error(key, value, "must be a finite number")
    if value < 0 or (positive and value <= 0):
        raise config_error(key, value, "must be > 0" if positive else "must be >= 0")
    return float(value)


def _free_bytes(root_dir: str) -> int:
    """The free space of the file system `root_dir` is (or would be made) on."""
    try:
        path = Path(root_dir).absolute()
        while not path.exists():
            path = path.parent
        return shutil.disk_usage(path).free
    except (OSError, ValueError) as exc:
        raise config_error(
            "root_dir", root_dir, f"its file system's free space is unknown ({exc})"
        ) from None


def secondary_tier(index: int, raw: Any, block_bytes: int) -> StorageTierSpec:
    """secondary_tiers[index] as a tier of blocks of `block_bytes`."""
    where = f"secondary_tiers[{index}]"
    if not isinstance(raw, Mapping):
        raise config_error(where, raw, "must be an object")
    kind = raw.get("type")
    if not kind:
        raise ConfigError(f"kv_transfer_config {where}: Secondary tier configuration must "
                          "include 'type'")  # fmt: skip
    if kind in _UNMODELLED_TIERS or (kind not in ("fs", "obj") and "module_path" in raw):
        raise config_error(f"{where}.type", kind, "is not modelled by mocker (its tiers: fs, obj)")
    if kind not in ("fs", "obj"):
        raise config_error(f"{where}.type", kind, "Unknown secondary tier type (vLLM's: "
                           "example, fs, p2p, obj, kvcr; mocker models fs and obj)")  # fmt: skip
    for key in raw:
        if key not in _TIER_KEYS | _TIER_IGNORED:
            raise config_error(f"{where}.{key}", raw[key], "unknown key")
    kind = StorageKind(kind)
    root = raw.get("root_dir")
    if root is not None and (not isinstance(root, str) or not root or "\0" in root):
        raise config_error(f"{where}.root_dir", root, "must be a directory path")
    if "capacity_bytes" in raw:
        capacity = number(f"{where}.capacity_bytes", raw["capacity_bytes"], positive=True)
        blocks = int(min(capacity // block_bytes, UNBOUNDED_BLOCKS))
    elif kind is StorageKind.OBJ:
        blocks = UNBOUNDED_BLOCKS
    elif root is None:
        raise ConfigError(f"kv_transfer_config {where}: an fs tier needs root_dir (vLLM's; "
                          "mocker sizes the tier by its file system's free space) or "
                          "capacity_bytes")  # fmt: skip
    else:  # vLLM's fs tier fills its disk
        blocks = min(_free_bytes(root) // block_bytes, UNBOUNDED_BLOCKS)
    if blocks < 1:
        size = raw.get("capacity_bytes", f"the free space of {root}")
        raise config_error(
            f"{where}.capacity_bytes", size, f"holds no block of {block_bytes} bytes"
        )
    values = dict(STORAGE_DEFAULTS[kind])
    for key in ("read_gbps", "write_gbps", "latency_ms"):
        if key in raw:
            values[key] = number(f"{where}.{key}", raw[key])
    failure = number(f"{where}.failure_rate", raw.get("failure_rate", 0.0))
    if failure > 1:
        raise config_error(f"{where}.failure_rate", failure, "must be in [0, 1]")
    events = raw.get("enable_kv_events", False)  # vLLM's default: the tier publishes nothing
    if not isinstance(events, bool):
        raise config_error(f"{where}.enable_kv_events", events, "must be true or false")
    return StorageTierSpec(kind, blocks, values["read_gbps"], values["write_gbps"],
                           values["latency_ms"], failure, events)  # fmt: skip
