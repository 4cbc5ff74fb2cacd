"""vLLM's --kv-transfer-config (OffloadingConnector, NixlConnector): honoured, and every
mistake named."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from mocker.config import ConfigError
from mocker.config_choices import KVRole
from mocker.settings import resolve
from mocker.settings.engine import engine_config_from
from mocker.settings.kv_transfer import parse_kv_transfer_config
from mocker.settings.secondary_tiers import STORAGE_DEFAULTS, UNBOUNDED_BLOCKS
from mocker.storage_spec import StorageKind
from tests.support.settings import ALL, parse_flags

BLOCK_BYTES = 16 * 131072  # Llama-3-8B, 16-token blocks: 2 MiB


def offloading(**extra: object) -> str:
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": extra})  # fmt: skip


def test_cpu_tier_from_cpu_bytes_to_use() -> None:
    s = parse_kv_transfer_config(offloading(cpu_bytes_to_use=64 * BLOCK_BYTES), 16, 131072)
    assert s["num_cpu_blocks"] == 64 and s["offload_policy"] == "write-through"
    assert s["offload_prompt_only"] is True and s["storage_tiers"] == ()


def test_tiering_spec_with_fs_and_obj() -> None:
    raw = offloading(
        spec_name="TieringOffloadingSpec", cpu_bytes_to_use=8 * BLOCK_BYTES, block_size=32,
        offload_prompt_only=False,
        secondary_tiers=[
            {"type": "fs", "root_dir": "/mnt/kv", "capacity_bytes": 100 * BLOCK_BYTES},
            {"type": "obj", "capacity_bytes": 1000 * BLOCK_BYTES, "read_gbps": 3,
             "latency_ms": 2, "failure_rate": 0.01},
        ],
    )  # fmt: skip
    s = parse_kv_transfer_config(raw, 16, 131072)
    fs, obj = s["storage_tiers"]
    assert (fs.kind, fs.capacity_blocks) == (StorageKind.FS, 100)
    assert fs.read_gbps == STORAGE_DEFAULTS[StorageKind.FS]["read_gbps"]
    assert (obj.kind, obj.capacity_blocks, obj.read_gbps, obj.latency_ms, obj.failure_rate) == (
        StorageKind.OBJ, 1000, 3.0, 2.0, 0.01
    )  # fmt: skip
    assert s["chunk_blocks"] == 2 and s["offload_prompt_only"] is False


def test_a_vllm_034_tiering_config_is_taken_verbatim(tmp_path: Path) -> None:
    # vLLM 0.34's keys, and its fs tier without a size: it fills its file system, so mocker
    # sizes it by the free space there (of the nearest existing directory: vLLM makes
    # root_dir); obj without a size is unbounded.
    raw = offloading(
        spec_name="TieringOffloadingSpec", cpu_bytes_to_use=8 * BLOCK_BYTES, blocks_per_chunk=2,
        tier_poll_interval_s=0.001, sync_load_budget_bytes=0, max_tracker_size=64000,
        canonical_layout=False, eviction_policy="lru", self_describing_kv_events=True,
        backpressure={"high_water_s": 0.5, "low_water_s": 0.1},
        secondary_tiers=[
            {"type": "fs", "root_dir": str(tmp_path / "kv" / "made-later"), "n_read_threads": 16,
             "n_write_threads": 16, "enable_kv_events": True, "locality": "LOCAL",
             "backpressure": {"high_water_s": 1.0, "low_water_s": 0.2}},
            {"type": "obj", "store_config": {"bucket": "kv", "endpoint_override": "http://s3"},
             "prefix": "m", "io_threads": 4},
        ],
    )  # fmt: skip
    free = shutil.disk_usage(tmp_path).free // BLOCK_BYTES
    s = parse_kv_transfer_config(raw, 16, 131072)
    fs, obj = s["storage_tiers"]
    assert abs(fs.capacity_blocks - free) <= max(1, free // 100)  # (the disk is shared)
    assert obj.capacity_blocks == UNBOUNDED_BLOCKS
    assert fs.enable_kv_events and not obj.enable_kv_events  # (vLLM's default: false)
    assert s["chunk_blocks"] == 2 and s["self_describing_kv_events"] is True


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"block_size": 32, "blocks_per_chunk": 2},
         "Specify only one of 'block_size' or 'blocks_per_chunk'"),
        ({"blocks_per_chunk": 0}, "blocks_per_chunk=0: must be greater than 0"),
        ({"blocks_per_chunk": 1 << 30}, "must be at most 2^20 blocks"),
        ({"blocks_per_chunk": "two"}, "blocks_per_chunk='two': must be a whole number"),
        ({"block_size": 24}, "Use 32 instead, or set 'blocks_per_chunk'"),
        ({"secondary_tiers": [{"type": "kvcr"}]}, "'kvcr': is not modelled by mocker"),
        ({"secondary_tiers": [{"type": "p2p", "host": "h"}]}, "'p2p': is not modelled"),
        ({"secondary_tiers": [{"type": "example", "custom_param": 1}]}, "is not modelled"),
        ({"secondary_tiers": [{"type": "Mine", "module_path": "my.tiers"}]}, "is not modelled"),
        ({"secondary_tiers": [{"type": "nvme"}]}, "Unknown secondary tier type"),
        ({"secondary_tiers": [{"root_dir": "/kv"}]}, "must include 'type'"),
        ({"secondary_tiers": [{"type": "fs"}]}, "an fs tier needs root_dir"),
        ({"secondary_tiers": [{"type": "fs", "root_dir": ""}]}, "root_dir='': must be"),
    ],
)  # fmt: skip
def test_vllm_034s_offload_mistakes(extra: dict[str, object], message: str) -> None:
    raw = offloading(spec_name="TieringOffloadingSpec", cpu_bytes_to_use=BLOCK_BYTES, **extra)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_kv_transfer_config(raw, 16, 131072)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({}, "cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": 1}, "cpu_bytes_to_use"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "eviction_policy": "arc"}, "eviction_policy"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "block_size": 24}, "block_size"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "Nope"}, "spec_name"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "bogus": 1}, "bogus"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "secondary_tiers": [{"type": "fs"}]},
         "secondary_tiers"),  # without TieringOffloadingSpec
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "TieringOffloadingSpec",
          "secondary_tiers": [{"type": "p2p", "capacity_bytes": BLOCK_BYTES}]},
         "secondary_tiers[0].type"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "TieringOffloadingSpec",
          "secondary_tiers": [{"type": "fs"}]}, "capacity_bytes"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "TieringOffloadingSpec",
          "secondary_tiers": [{"type": "fs", "capacity_bytes": BLOCK_BYTES, "speed": 1}]},
         "secondary_tiers[0].speed"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "TieringOffloadingSpec",
          "secondary_tiers": [{"type": "fs", "capacity_bytes": BLOCK_BYTES,
                               "failure_rate": 2}]}, "failure_rate"),
        # Not finite: one line naming the key, never a conversion's traceback.
        ({"cpu_bytes_to_use": float("inf")}, "cpu_bytes_to_use=inf: must be a finite number"),
        ({"cpu_bytes_to_use": float("nan")}, "cpu_bytes_to_use=nan: must be a finite number"),
        ({"cpu_bytes_to_use": BLOCK_BYTES, "spec_name": "TieringOffloadingSpec",
          "secondary_tiers": [{"type": "fs", "capacity_bytes": float("inf")}]},
         "secondary_tiers[0].capacity_bytes=inf"),
    ],
)  # fmt: skip
def test_a_bad_config_names_its_key(extra: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_kv_transfer_config(offloading(**extra), 16, 131072)


def test_not_json_and_bad_role() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_kv_transfer_config("{kv_connector", 16, 131072)
    with pytest.raises(ConfigError, match="kv_role"):
        parse_kv_transfer_config('{"kv_connector": "OffloadingConnector", "kv_role": "x"}', 16, 1)


def test_a_connector_vllm_does_not_register_is_refused() -> None:
    with pytest.raises(ConfigError, match="Unsupported connector type: NixlConector"):
        parse_kv_transfer_config('{"kv_connector": "NixlConector", "kv_role": "kv_producer"}',
                                 16, 131072)  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [{"kv_connector": "MyConnector", "kv_connector_module_path": "my.module"},
     {"kv_connector": "MooncakeConnector", "kv_role": "kv_both"},
     {"kv_connector": "DecodeBenchConnector"}, {"kv_connector": "ExampleConnector"},
     {"kv_connector": "MultiConnector", "kv_connector_extra_config": {
         "connectors": [{"kv_connector": "FlexKVConnectorV1"}]}}],
)  # fmt: skip
def test_a_connector_mocker_does_not_model_stops_start_up(config: dict[str, object]) -> None:
    # One vLLM knows (or imports from kv_connector_module_path) would change nothing here:
    # a rig would run without the behaviour it configured, so it is refused by name.
    name = str(config["kv_connector"])
    if name == "MultiConnector":
        name = "FlexKVConnectorV1"
    with pytest.raises(ConfigError, match=f"{name} is not modelled by mocker"):
        parse_kv_transfer_config(json.dumps(config), 16, 131072, environ={})


def test_a_misspelt_key_of_the_config_is_refused() -> None:
    # Misspelt, the extra config's keys would be dropped without a word.
    raw = {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
           "kv_conector_extra_config": {"pull_gbps": 5}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"kv_conector_extra_config=.*unknown key"):
        parse_kv_transfer_config(json.dumps(raw), 16, 131072)


def test_flag_builds_the_engine_config_and_conflicts_with_the_host_flags() -> None:
    fs = {"type": "fs", "capacity_bytes": 64 * BLOCK_BYTES}
    raw = offloading(
        cpu_bytes_to_use=32 * BLOCK_BYTES, spec_name="TieringOffloadingSpec", secondary_tiers=[fs]
    )
    values, _ = resolve(parse_flags(["--kv-transfer-config", raw]), ALL, environ={})
    config = engine_config_from(values)
    assert (
        config.offload.num_cpu_blocks == 32
        and config.offload.storage_tiers[0].capacity_blocks == 64
    )
    values, _ = resolve(
        parse_flags(["--kv-transfer-config", raw, "--num-host-blocks", "8"]), ALL, environ={}
    )
    with pytest.raises(ConfigError, match="num-host-blocks"):
        engine_config_from(values)


def nixl(role: str | None, **rest: object) -> str:
    config: dict[str, object] = {"kv_connector": "NixlConnector", **rest}
    if role is not None:
        config["kv_role"] = role
    return json.dumps(config)


def test_nixl_connector_makes_a_pd_role() -> None:
    extra = {"pull_gbps": 12.5, "pull_latency_ms": 0, "pull_timeout_s": 9,
             "kv_lease_duration": 60}  # fmt: skip
    raw = nixl("kv_consumer", engine_id="d0", kv_connector_extra_config=extra)
    values, _ = resolve(parse_flags(["--kv-transfer-config", raw, "--num-host-blocks", "8"]),
                        ALL, environ={})  # fmt: skip
    config = engine_config_from(values)
    assert config.transfer.kv_role.consumes and not config.transfer.kv_role.produces
    assert config.transfer.kv_engine_id == "d0" and config.transfer.pull_gbps == 12.5
    assert (
        config.transfer.pull_latency_ms == 0
        and config.transfer.pull_timeout == 9
        and config.transfer.hold_timeout == 60
    )
    assert config.offload.num_cpu_blocks == 8  # the offload flags still build a CPU tier
    # vLLM's default engine id: a fresh uuid per start.
    one = parse_kv_transfer_config(nixl("kv_producer"), 16, 1)["kv_engine_id"]
    assert one != parse_kv_transfer_config(nixl("kv_producer"), 16, 1)["kv_engine_id"]
    assert len(one) == 36


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (nixl(None), "needs kv_role"),
        (nixl("kv_both", kv_load_failure_policy="fail"), "only 'recompute'"),
        (nixl("kv_both", kv_load_failure_policy="x"), "kv_load_failure_policy"),
        (nixl("kv_both", engine_id=3), "engine_id"),
        (nixl("kv_both", kv_connector_extra_config={"bogus": 1}), "bogus"),
        (nixl("kv_both", kv_connector_extra_config={"pull_gbps": 0}), "pull_gbps"),
        (nixl("kv_both", kv_connector_extra_config={"kv_lease_duration": -1}), "kv_lease_duration"),
    ],
)
def test_a_bad_nixl_config_names_its_key(raw: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_kv_transfer_config(raw, 16, 131072)


def test_multi_connector_gives_pd_and_tiers_together() -> None:
    raw = json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_consumer",
                      "engine_id": "d", "kv_connector_extra_config": {"connectors": [
                          {"kv_connector": "NixlConnector"},
                          {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"cpu_bytes_to_use": 8 * BLOCK_BYTES}},
                      ]}})  # fmt: skip
    values, _ = resolve(parse_flags(["--kv-transfer-config", raw]), ALL, environ={})
    config = engine_config_from(values)
    assert config.transfer.kv_role.consumes and config.transfer.kv_engine_id == "d"
    assert config.offload.num_cpu_blocks == 8 and config.offload.offload_policy == "write-through"
    pair = [{"kv_connector": "NixlConnector"}, {"kv_connector": "NixlConnector"}]
    two = json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"connectors": pair}})  # fmt: skip
    with pytest.raises(ConfigError, match="second connector of the same kind"):
        parse_kv_transfer_config(two, 16, 131072)
    failing = json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                          "kv_load_failure_policy": "fail",
                          "kv_connector_extra_config": {"connectors": pair[:1]}})  # fmt: skip
    with pytest.raises(ConfigError, match="only 'recompute'"):
        parse_kv_transfer_config(failing, 16, 131072)
    # vLLM 0.34's NixlPushConnector (WRITE): the same P/D settings, in push mode.
    push = parse_kv_transfer_config(nixl("kv_consumer", kv_connector="NixlPushConnector"), 16, 1)
    assert push["kv_transfer_mode"] == "push" and push["kv_role"] == KVRole.CONSUMER


@pytest.mark.parametrize(
    ("extra", "chunk_blocks"),
    [({"block_size": None}, 1), ({"blocks_per_chunk": None, "block_size": 32}, 2),
     ({"blocks_per_chunk": "4"}, 4), ({"block_size": "48"}, 3)],
)  # fmt: skip
def test_a_chunk_size_as_vllm_reads_it(extra: dict[str, object], chunk_blocks: int) -> None:
    # vLLM reads the keys with .get() (null: unset) and int() (text of a number: that number).
    # Its offload keys are a chunk's (its last block's hash): whole chunks are stored and
    # found (a hit one token short of a whole prompt is still loaded).
    raw = offloading(cpu_bytes_to_use=8 * BLOCK_BYTES, **extra)
    settings = parse_kv_transfer_config(raw, 16, 131072)
    assert settings["chunk_blocks"] == chunk_blocks and "min_load_blocks" not in settings


def test_an_fs_tier_whose_disk_cannot_be_read_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(path: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(shutil, "disk_usage", refused)
    raw = offloading(spec_name="TieringOffloadingSpec", cpu_bytes_to_use=BLOCK_BYTES,
                     secondary_tiers=[{"type": "fs", "root_dir": "/kv"}])  # fmt: skip
    with pytest.raises(ConfigError, match="root_dir='/kv': its file system's free space"):
        parse_kv_transfer_config(raw, 16, 131072)


@pytest.mark.parametrize(
    "connector",
    [{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
     {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
         "connectors": [{"kv_connector": "NixlConnector"},
                        {"kv_connector": "LMCacheConnectorV1"}]}}],
)  # fmt: skip
def test_a_connector_without_hma_turns_the_hybrid_manager_off(connector: dict[str, object]) -> None:
    # vLLM 0.34 turns the hybrid KV cache manager off for a connector that does not support
    # it (a MultiConnector: unless all its children do): a sliding-window model keeps every
    # layer's KV, a model with Mamba layers does not start.
    flags = ["--model-shape", "gpt-oss-20b", "--timing-model", "polynomial",
             "--num-gpu-blocks-override", "4096", "--max-model-len", "4096",
             "--kv-transfer-config", json.dumps(connector)]  # fmt: skip
    values, _ = resolve(parse_flags(flags), ALL, environ={})
    config = engine_config_from(values)
    assert config.cache.disable_hybrid_kv_cache_manager and not config.is_hybrid
    flags[1] = "qwen3-next-80b-a3b"
    values, _ = resolve(parse_flags(flags), ALL, environ={})
    with pytest.raises(ConfigError, match="a model with Mamba layers needs"):
        engine_config_from(values)
    offloading = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}  # fmt: skip
    flags[1], flags[-1] = "gpt-oss-20b", json.dumps(offloading)
    values, _ = resolve(parse_flags(flags), ALL, environ={})
    assert engine_config_from(values).is_hybrid  # (OffloadingConnector supports it)
