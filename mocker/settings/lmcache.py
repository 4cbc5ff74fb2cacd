"""LMCache's configuration (`LMCacheConnectorV1`), read as LMCache 0.5 reads it and mapped onto
the tier stack: its CPU backend the CPU tier, its local disk an `fs` tier, its remote store
an `obj` tier; stores and hits in whole chunks of `chunk_size` tokens."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from mocker.config import ConfigError
from mocker.settings.secondary_tiers import STORAGE_DEFAULTS, UNBOUNDED_BLOCKS
from mocker.storage_spec import StorageKind, StorageTierSpec

__all__ = ["CONFIG_FILE_ENV", "lmcache_settings"]

CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
_ENV_PREFIX = "LMCACHE_"
_GIB = 1024**3  # LMCache's "GB" sizes are multiplied by 1024**3
# LMCache's backends get the tiers' links: its local disk an NVMe drive's (fs), its remote
# store (an lm:// server, Redis, Mooncake...) a networked store's (obj), unbounded.


def _to_bool(value: Any) -> bool:
    # LMCache's _to_bool: a bool as it is, else "true" / "1" (any case) is true.
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1")


def _to_int(value: Any) -> int:
    if isinstance(value, bool | float):
        raise ValueError("must be a whole number")
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError("must be a finite number >= 0")
    return number


def _to_text(value: Any) -> str | None:
    return None if value is None else str(value)


# The keys this mock reads, with LMCache 0.5's defaults and converters
# (lmcache/v1/config.py). LMCache's other keys tune what is not modelled (serde, layerwise
# pipelining, controllers, P2P, blending...) and are accepted as LMCache accepts them.
_KEYS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "chunk_size": (256, _to_int),
    "local_cpu": (True, _to_bool),
    "max_local_cpu_size": (5.0, _to_float),
    "local_disk": (None, _to_text),
    "max_local_disk_size": (0.0, _to_float),
    "remote_url": (None, _to_text),
    "save_decode_cache": (False, _to_bool),
    "save_unfull_chunk": (False, _to_bool),
    "internal_api_server_enabled": (False, _to_bool),
    "internal_api_server_host": ("127.0.0.1", _to_text),
    "internal_api_server_port_start": (6999, _to_int),
}


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"{CONFIG_FILE_ENV}={path!r}: cannot read it ({exc.strerror or exc})"
        ) from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{CONFIG_FILE_ENV}={path!r} is not valid YAML/JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{CONFIG_FILE_ENV}={path!r} must hold a mapping of key: value")
    return {str(k): v for k, v in data.items()}


def _raw_config(environ: Mapping[str, str], extra: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Each key's raw value and where it came from: the file ($LMCACHE_CONFIG_FILE), then
    LMCACHE_<KEY> variables over it, then the connector's `lmcache.<key>` extra config."""
    raw: dict[str, tuple[Any, str]] = {}
    path = environ.get(CONFIG_FILE_ENV)
    if path is not None:
        for key, value in _read_file(path).items():
            raw[key] = (value, f"{key!r} in {path}")
    for key in _KEYS:
        env = _ENV_PREFIX + key.upper()
        if env in environ:
            raw[key] = (environ[env], env)
    for key, value in extra.items():
        if key.startswith("lmcache."):
            name = key.removeprefix("lmcache.")
            raw[name] = (value, f"kv_connector_extra_config.{key}")
    return raw


def _values(raw: Mapping[str, tuple[Any, str]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, (default, convert) in _KEYS.items():
        if key not in raw:
            values[key] = default
            continue
        value, where = raw[key]
        try:
            values[key] = None if value is None else convert(value)
        except (TypeError, ValueError) as exc:
            why = str(exc) if "must" in str(exc) else "not a valid value"
            raise ConfigError(f"invalid LMCache {where}={value!r}: {why}") from None
    return values


def _disk_path(local_disk: str) -> str:
    # LMCache's local_disk is a "file:///path/" URL (a plain path works too).
    return local_disk.removeprefix("file://") or "/"


def lmcache_settings(
    extra: Mapping[str, Any], gpu_block_size: int, gpu_block_bytes: int, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The OffloadSettings fields of an LMCache config: the CPU tier (max_local_cpu_size GB),
    an `fs` tier (local_disk with max_local_disk_size GB), an `obj` tier (remote_url),
    write-through stores of prompt chunks (decode chunks too with save_decode_cache), loads
    and stores in whole chunks."""
    values = _values(_raw_config(environ, extra))
    chunk = values["chunk_size"]
    if chunk < 1 or chunk > 1 << 24:
        raise ConfigError(f"invalid LMCache chunk_size={chunk!r}: must be 1 to 2^24 tokens")
    if chunk % gpu_block_size:
        raise ConfigError(
            f"LMCache chunk_size={chunk} is not a multiple of the KV cache block size "
            f"({gpu_block_size} tokens): mocker keeps KV in whole blocks, so it models chunks "
            "of whole blocks only"
        )
    if values["save_unfull_chunk"]:
        raise ConfigError(
            "LMCache save_unfull_chunk=true is not modelled by mocker (a prompt's partial "
            "last chunk is never stored here): leave it false, LMCache's default"
        )
    if not values["local_cpu"]:
        raise ConfigError(
            "LMCache local_cpu=false is not modelled by mocker: every load and store goes "
            "through its CPU tier; set max_local_cpu_size instead"
        )
    cpu_blocks = int(values["max_local_cpu_size"] * _GIB // gpu_block_bytes)
    if cpu_blocks < 1:
        raise ConfigError(
            f"LMCache max_local_cpu_size={values['max_local_cpu_size']!r} GB holds no KV "
            f"block of {gpu_block_bytes} bytes: raise it"
        )
    tiers: list[StorageTierSpec] = []
    disk, disk_gb = values["local_disk"], values["max_local_disk_size"]
    if disk is not None and disk_gb > 0:  # LMCache's disk backend needs both
        if not _disk_path(disk):
            raise ConfigError(f"invalid LMCache local_disk={disk!r}: must name a directory")
        blocks = int(disk_gb * _GIB // gpu_block_bytes)
        if blocks < 1:
            raise ConfigError(
                f"LMCache max_local_disk_size={disk_gb!r} GB holds no KV block of "
                f"{gpu_block_bytes} bytes: raise it"
            )
        tiers.append(
            StorageTierSpec(
                StorageKind.FS, blocks, enable_kv_events=False, **STORAGE_DEFAULTS[StorageKind.FS]
            )
        )
    if values["remote_url"] is not None:
        tiers.append(
            StorageTierSpec(
                StorageKind.OBJ,
                UNBOUNDED_BLOCKS,
                enable_kv_events=False,
                **STORAGE_DEFAULTS[StorageKind.OBJ],
            )
        )
    chunk_blocks = chunk // gpu_block_size
    api = None
    if values["internal_api_server_enabled"]:  # its metrics' only door (a worker's: +1)
        port = values["internal_api_server_port_start"]
        if not 0 <= port <= 65534:
            raise ConfigError(
                f"invalid LMCache internal_api_server_port_start={port!r}: must be 0 (the "
                "system picks) to 65534"
            )
        api = (values["internal_api_server_host"] or "127.0.0.1", port)
    return {
        "num_cpu_blocks": cpu_blocks,
        "offload_policy": "write-through",
        "offload_prompt_only": not values["save_decode_cache"],
        "storage_tiers": tuple(tiers),
        "min_load_blocks": 1,  # (its min_retrieve_tokens: 0)
        "chunk_blocks": chunk_blocks,
        "offload_backend": "lmcache",
        "sync_loads": True,  # (its connector reports every load as synchronous)
        "lmcache_api": api,
    }
