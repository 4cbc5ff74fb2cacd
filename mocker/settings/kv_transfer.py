"""vLLM's `--kv-transfer-config`, parsed into engine settings: KV offloading
(`OffloadingConnector`: the tiers) and P/D disaggregation (`NixlConnector`: the role, the
pull link, the hold lease); every mistake names its key and stops start-up."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from mocker.config import ConfigError
from mocker.settings.lmcache import lmcache_settings
from mocker.settings.secondary_tiers import config_error, number, secondary_tier

__all__ = [
    "CONNECTORS",
    "NO_HMA",
    "NO_HMA_CONNECTORS",
    "OffloadSettings",
    "parse_kv_transfer_config",
]

_ROLES = ("kv_both", "kv_producer", "kv_consumer")
# vLLM's KVTransferConfig fields: another key is a mistake (a misspelt
# kv_connector_extra_config would drop every key in it).
_CONFIG_KEYS = {"kv_connector", "engine_id", "kv_buffer_device", "kv_buffer_size", "kv_role",
                "kv_rank", "kv_parallel_size", "kv_ip", "kv_port", "kv_connector_extra_config",
                "kv_connector_module_path", "enable_permute_local_kv",
                "kv_load_failure_policy"}  # fmt: skip
# The connectors vLLM's KVConnectorFactory registers; another name needs
# kv_connector_module_path (vLLM imports the class from it; mocker refuses it, unmodelled).
CONNECTORS = ("DecodeBenchConnector", "ExampleConnector", "ExampleHiddenStatesConnector",
              "FlexKVConnectorV1", "HF3FSKVConnector", "HiSparseConnector", "LMCacheConnectorV1",
              "LMCacheMPConnector", "MoRIIOConnector", "MooncakeConnector",
              "MooncakeStoreConnector", "MultiConnector", "NixlConnector", "NixlPullConnector",
              "NixlPushConnector", "OffloadingConnector", "SimpleCPUOffloadConnector",
              "UMBPStoreConnector")  # fmt: skip
# Those that do not support the hybrid KV cache manager (no SupportsHMA): vLLM turns it off
# for them, and a model with Mamba layers then fails to start. (LMCacheMPConnector is
# LMCache's own class when LMCache is installed, which supports it.) Of these mocker models
# LMCacheConnectorV1.
NO_HMA_CONNECTORS = ("ExampleConnector", "FlexKVConnectorV1", "HF3FSKVConnector",
                     "LMCacheConnectorV1")  # fmt: skip
# The OffloadSettings key that names such a connector (popped before the engine config).
NO_HMA = "_no_hma_connector"
_NIXL = ("NixlConnector", "NixlPullConnector", "NixlPushConnector")
# The connectors mocker models; another one vLLM registers stops start-up.
MODELLED = ("LMCacheConnectorV1", "MultiConnector", "OffloadingConnector", *_NIXL)
# NixlConnector extra-config keys: vLLM's lease, and the mock's pull link; vLLM's keys that
# mean nothing here pass.
_NIXL_KEYS = {"kv_lease_duration", "pull_gbps", "pull_latency_ms", "pull_timeout_s"}
_NIXL_IGNORED = {"backends", "enforce_handshake_compat", "num_threads", "decoder_kv_blocks_ttl",
                 "bidirectional_kv_xfer"}  # fmt: skip
_SPECS = ("CPUOffloadingSpec", "TieringOffloadingSpec")
# vLLM's extra-config keys this mock reads, and those it accepts without a use for them.
_EXTRA_KEYS = {"spec_name", "cpu_bytes_to_use", "block_size", "blocks_per_chunk",
               "eviction_policy", "offload_prompt_only", "secondary_tiers", "store_threshold",
               "hybrid_chunk_size", "self_describing_kv_events"}  # fmt: skip
# vLLM 0.34's keys that tune what mocker does not model (threads, polling, back-pressure,
# layouts), and older ones.
_EXTRA_IGNORED = {"spec_module_path", "num_cpu_blocks", "backpressure", "cache_policy_module_path",
                  "canonical_layout", "max_tracker_size", "sync_load_budget_bytes",
                  "tier_poll_interval_s"}  # fmt: skip


class OffloadSettings(dict[str, Any]):
    """EngineConfig fields set by an OffloadingConnector config (empty: none given)."""


def parse_kv_transfer_config(
    raw: str | Mapping[str, Any] | None,
    gpu_block_size: int,
    kv_bytes_per_token: int,
    environ: Mapping[str, str] | None = None,
    needs_hma: bool = False,
) -> OffloadSettings:
    """The engine settings a connector config implies. `OffloadingConnector`: the CPU tier's
    blocks (from `cpu_bytes_to_use`), write-through stores, `offload_prompt_only`, the
    secondary tiers, and the shortest load (vLLM's offload `block_size`, in device blocks).
    `LMCacheConnectorV1`: its tiers from LMCache's own config (`environ`'s LMCACHE_*; None:
    the process's). `NixlConnector`: the P/D role and its settings. `MultiConnector`: both.
    Another connector is refused, and one without the hybrid KV cache manager if the model
    `needs_hma` (Mamba layers)."""
    if raw is None:
        return OffloadSettings()
    config = _load(raw)
    for key in config:
        if key not in _CONFIG_KEYS:
            raise config_error(key, config[key], "unknown key (vLLM's KVTransferConfig has "
                        + ", ".join(sorted(_CONFIG_KEYS)) + ")")  # fmt: skip
    for key in ("kv_connector", "kv_role", "kv_connector_module_path"):
        if key in config and not isinstance(config[key], str):
            raise config_error(key, config[key], "must be a string")
    name = config.get("kv_connector")
    own = "kv_connector_module_path" in config  # vLLM imports the class from it
    if name is not None and name not in CONNECTORS and not own:
        raise ConfigError(
            f"kv_transfer_config: Unsupported connector type: {name} (vLLM's: "
            + ", ".join(CONNECTORS)
            + ")"
        )
    role = config.get("kv_role")
    if role is not None and role not in _ROLES:
        raise config_error("kv_role", role, "must be one of " + ", ".join(_ROLES))
    connector = config.get("kv_connector")
    if connector is not None and connector not in MODELLED:
        raise ConfigError(
            f"kv_transfer_config: {connector} is not modelled by mocker (its connectors: "
            + ", ".join(MODELLED)
            + ")"
        )
    if needs_hma and connector in NO_HMA_CONNECTORS:
        raise ConfigError(
            f"kv_transfer_config: {connector} does not support the hybrid KV cache manager, "
            "which a model with Mamba layers needs (vLLM's hybrid SSM models fail at "
            "start-up without it)"
        )
    if connector == "MultiConnector":
        return _multi(config, role, gpu_block_size, kv_bytes_per_token, environ, needs_hma)
    if connector in _NIXL:
        settings = _nixl(config, role)
        if connector == "NixlPushConnector":
            settings["kv_transfer_mode"] = "push"
        return settings
    if connector == "LMCacheConnectorV1":
        extra = config.get("kv_connector_extra_config", {})
        if not isinstance(extra, Mapping):
            raise config_error("kv_connector_extra_config", extra, "must be an object")
        fields = lmcache_settings(
            extra, gpu_block_size, gpu_block_size * kv_bytes_per_token,
            os.environ if environ is None else environ,
        )  # fmt: skip
        return OffloadSettings({**fields, NO_HMA: connector})
    if connector != "OffloadingConnector":
        return OffloadSettings()
    extra = _extra(config, _EXTRA_KEYS | _EXTRA_IGNORED)
    spec_name = extra.get("spec_name", "CPUOffloadingSpec")
    if spec_name not in _SPECS:
        raise config_error("spec_name", spec_name, "must be one of " + ", ".join(_SPECS))
    if "cpu_bytes_to_use" not in extra:
        raise ConfigError(
            "kv_transfer_config: OffloadingConnector needs kv_connector_extra_config."
            "cpu_bytes_to_use (bytes of CPU memory for the CPU tier), as vLLM does"
        )
    gpu_block_bytes = gpu_block_size * kv_bytes_per_token
    cpu_bytes = number("cpu_bytes_to_use", extra["cpu_bytes_to_use"], positive=True)
    cpu_blocks = int(cpu_bytes // gpu_block_bytes)
    if cpu_blocks < 1:
        raise config_error("cpu_bytes_to_use", extra["cpu_bytes_to_use"],
                    f"holds no block of {gpu_block_bytes} bytes")  # fmt: skip
    block_size = _chunk_tokens(extra, gpu_block_size)
    policy = extra.get("eviction_policy", "lru")
    if policy == "arc":
        raise config_error("eviction_policy", policy, "arc is not modelled by mocker; use lru")
    if policy != "lru":
        raise config_error("eviction_policy", policy, "must be lru (or vLLM's arc, not modelled)")
    threshold = extra.get("store_threshold", 0)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold > 1:
        raise config_error("store_threshold", threshold,
                    "mocker stores every block on first sight: only 0 or 1")  # fmt: skip
    prompt_only = extra.get("offload_prompt_only", True)
    if not isinstance(prompt_only, bool):
        raise config_error("offload_prompt_only", prompt_only, "must be true or false")
    tiers_raw = extra.get("secondary_tiers", [])
    if not isinstance(tiers_raw, list):
        raise config_error("secondary_tiers", tiers_raw, "must be a list of tier objects")
    if tiers_raw and spec_name != "TieringOffloadingSpec":
        raise config_error("secondary_tiers", tiers_raw,
                    "needs spec_name TieringOffloadingSpec, as vLLM")  # fmt: skip
    tiers = tuple(secondary_tier(i, t, gpu_block_bytes) for i, t in enumerate(tiers_raw))
    settings = OffloadSettings(
        num_cpu_blocks=cpu_blocks,
        offload_policy="write-through",
        offload_prompt_only=prompt_only,
        storage_tiers=tiers,
        chunk_blocks=block_size // gpu_block_size,  # (vLLM stores and finds whole chunks)
    )
    describing = extra.get("self_describing_kv_events", False)
    if not isinstance(describing, bool):
        raise config_error("self_describing_kv_events", describing, "must be true or false")
    settings["self_describing_kv_events"] = describing
    if "hybrid_chunk_size" in extra:  # vLLM PR #38261's planner unit, in tokens
        chunk = extra["hybrid_chunk_size"]
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise config_error("hybrid_chunk_size", chunk, "must be a positive number of tokens")
        settings["hybrid_chunk_size"] = chunk
    return settings


def _multi(
    config: Mapping[str, Any],
    role: str | None,
    gpu_block_size: int,
    kv_bytes_per_token: int,
    environ: Mapping[str, str] | None,
    needs_hma: bool,
) -> OffloadSettings:
    """vLLM's MultiConnector: its `connectors` (each with the outer kv_role unless it names
    one), one of each kind at most: NixlConnector for P/D, OffloadingConnector for tiers."""
    connectors = _extra(config, {"connectors"}).get("connectors")
    if not isinstance(connectors, list) or not connectors:
        raise config_error("kv_connector_extra_config.connectors", connectors,
                    "MultiConnector needs a non-empty list of connector configs")  # fmt: skip
    merged = OffloadSettings()
    for i, sub in enumerate(connectors):
        if not isinstance(sub, Mapping):
            raise config_error(f"connectors[{i}]", sub, "must be an object")
        if sub.get("kv_connector") == "MultiConnector":
            raise config_error(f"connectors[{i}].kv_connector", "MultiConnector", "cannot nest")
        # The outer role, engine id and failure policy hold for a connector naming none.
        inherited = {k: config[k] for k in ("kv_role", "engine_id", "kv_load_failure_policy")
                     if config.get(k) is not None}  # fmt: skip
        settings = parse_kv_transfer_config(
            {**inherited, **sub}, gpu_block_size, kv_bytes_per_token, environ, needs_hma
        )
        clash = sorted(set(settings) & set(merged) - {NO_HMA})
        if clash:
            why = "a second connector of the same kind (sets " + ", ".join(clash) + ")"
            raise config_error(f"connectors[{i}]", sub.get("kv_connector"), why)
        merged.update(settings)
    return merged


def _extra(config: Mapping[str, Any], known: set[str]) -> Mapping[str, Any]:
    """kv_connector_extra_config, every key one the connector knows."""
    extra = config.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise config_error("kv_connector_extra_config", extra, "must be an object")
    for key in extra:
        if key not in known:
            raise config_error(f"kv_connector_extra_config.{key}", extra[key], "unknown key")
    return extra


def _nixl(config: Mapping[str, Any], role: str | None) -> OffloadSettings:
    """P/D settings: the role (vLLM requires one), the engine id (vLLM's default: a fresh
    uuid), the prefill side's lease (kv_lease_duration, 30 s) and the decode side's pull
    link."""
    if role is None:
        raise ConfigError("kv_transfer_config: NixlConnector needs kv_role "
                          "(kv_producer, kv_consumer or kv_both)")  # fmt: skip
    policy = config.get("kv_load_failure_policy", "recompute")
    if policy == "fail":
        raise config_error("kv_load_failure_policy", policy,
                    "mocker models only 'recompute' (a failed pull prefills locally)")  # fmt: skip
    if policy != "recompute":
        raise config_error("kv_load_failure_policy", policy, "must be recompute (or vLLM's fail)")
    engine_id = config.get("engine_id") or str(uuid.uuid4())
    if not isinstance(engine_id, str):
        raise config_error("engine_id", engine_id, "must be a string")
    extra = _extra(config, _NIXL_KEYS | _NIXL_IGNORED)
    settings = OffloadSettings(kv_role=role, kv_engine_id=engine_id)
    for key, field in (("kv_lease_duration", "hold_timeout"), ("pull_gbps", "pull_gbps"),
                       ("pull_latency_ms", "pull_latency_ms"),
                       ("pull_timeout_s", "pull_timeout")):  # fmt: skip
        if key in extra:
            settings[field] = number(key, extra[key], positive=key != "pull_latency_ms")
    return settings


def _load(raw: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"kv_transfer_config is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"kv_transfer_config must be a JSON object, got {raw!r}")
    return config


def _chunk_tokens(extra: Mapping[str, Any], gpu_block_size: int) -> int:
    """The offloaded chunk in tokens: vLLM 0.34's `block_size` (tokens) or `blocks_per_chunk`
    (device blocks), one device block by default."""
    blocks, size = extra.get("blocks_per_chunk"), extra.get("block_size")  # (null: unset)
    if blocks is not None and size is not None:
        raise ConfigError("kv_transfer_config: Specify only one of 'block_size' or "
                          "'blocks_per_chunk' in kv_connector_extra_config.")  # fmt: skip
    if blocks is not None:
        n = _whole("blocks_per_chunk", blocks)
        if n <= 0:
            raise config_error("blocks_per_chunk", blocks, "must be greater than 0")
        if n > 1 << 20:
            raise config_error("blocks_per_chunk", blocks, "must be at most 2^20 blocks")
        return n * gpu_block_size
    if size is None:
        return gpu_block_size
    size = _whole("block_size", size)
    if not 0 < size <= 1 << 24:
        raise config_error("block_size", size, "must be a positive number of tokens, at most 2^24")
    if size % gpu_block_size:
        up = -(-size // gpu_block_size) * gpu_block_size
        raise config_error("block_size", size,
                    f"must be a multiple of the GPU KV cache block size ({gpu_block_size} "
                    f"tokens). Use {up} instead, or set 'blocks_per_chunk' to express the "
                    "chunk size in blocks")  # fmt: skip
    return size


def _whole(key: str, value: Any) -> int:
    """A count as vLLM's int() reads it: an integer, or the text of one."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 20:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise config_error(key, value, "must be a whole number")
    return value
