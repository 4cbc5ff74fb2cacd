"""LMCacheConnectorV1: LMCache's own config (file, LMCACHE_* variables, `lmcache.*` extra
config) mapped onto the tier stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mocker.config import ConfigError
from mocker.engine.core import EngineCore
from mocker.settings import engine_config_from, resolve
from mocker.settings.kv_transfer import NO_HMA, parse_kv_transfer_config
from mocker.storage_spec import StorageKind
from tests.support.settings import ALL, parse_flags
from tests.support.workloads import two_rounds

BLOCK_BYTES = 16 * 131072  # block_size 16 × Llama-3-8B's bytes per token
GIB = 1024**3
LMCACHE = '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}'


def test_lmcaches_defaults_a_5_gb_cpu_tier_in_256_token_chunks() -> None:
    settings = parse_kv_transfer_config(LMCACHE, 16, 131072, environ={})
    assert settings["num_cpu_blocks"] == 5 * GIB // BLOCK_BYTES  # LMCache's GB is 1024**3
    assert settings["chunk_blocks"] == 16 and settings["min_load_blocks"] == 1
    assert settings["offload_policy"] == "write-through"
    assert settings["offload_prompt_only"] is True  # save_decode_cache false
    assert settings["storage_tiers"] == ()
    assert settings[NO_HMA] == "LMCacheConnectorV1"  # no hybrid KV cache manager with it


def test_the_file_then_the_environment_then_the_extra_config(tmp_path: Path) -> None:
    file = tmp_path / "lmcache.yaml"
    file.write_text("chunk_size: 512\nlocal_cpu: true\nmax_local_cpu_size: 2.0\n"
                    "local_disk: 'file:///mnt/kv/'\nmax_local_disk_size: 10\n"
                    "remote_url: 'lm://cache:65432'\nsave_decode_cache: true\n"
                    "remote_serde: naive\n")  # fmt: skip
    env = {"LMCACHE_CONFIG_FILE": str(file), "LMCACHE_MAX_LOCAL_CPU_SIZE": "4"}
    settings = parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)
    assert settings["num_cpu_blocks"] == 4 * GIB // BLOCK_BYTES  # the variable over the file
    assert settings["chunk_blocks"] == 32 and settings["offload_prompt_only"] is False
    fs, obj = settings["storage_tiers"]
    assert (fs.kind, fs.capacity_blocks) == (StorageKind.FS, 10 * GIB // BLOCK_BYTES)
    assert obj.kind is StorageKind.OBJ  # the remote store: shared, as LMCache's server is
    assert not fs.enable_kv_events and not obj.enable_kv_events
    extra = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
             "kv_connector_extra_config": {"lmcache.chunk_size": 64,
                                           "lmcache.max_local_cpu_size": 1}}  # fmt: skip
    settings = parse_kv_transfer_config(json.dumps(extra), 16, 131072, environ=env)
    assert settings["chunk_blocks"] == 4 and settings["num_cpu_blocks"] == GIB // BLOCK_BYTES


def test_the_environment_alone_as_lmcache_reads_it() -> None:
    env = {"LMCACHE_CHUNK_SIZE": "128", "LMCACHE_LOCAL_DISK": "file:///kv/",
           "LMCACHE_MAX_LOCAL_DISK_SIZE": "0"}  # fmt: skip
    settings = parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)
    assert settings["chunk_blocks"] == 8
    assert settings["storage_tiers"] == ()  # a disk needs both local_disk and a size


@pytest.mark.parametrize(
    ("env", "message"),
    [({"LMCACHE_CHUNK_SIZE": "100"}, "chunk_size=100 is not a multiple"),
     ({"LMCACHE_CHUNK_SIZE": "x"}, "LMCACHE_CHUNK_SIZE='x'"),
     ({"LMCACHE_MAX_LOCAL_CPU_SIZE": "-1"}, "LMCACHE_MAX_LOCAL_CPU_SIZE='-1'.*>= 0"),
     ({"LMCACHE_MAX_LOCAL_CPU_SIZE": "0"}, "holds no KV block"),
     ({"LMCACHE_SAVE_UNFULL_CHUNK": "True"}, "save_unfull_chunk=true is not modelled"),
     ({"LMCACHE_LOCAL_CPU": "false"}, "local_cpu=false is not modelled"),
     ({"LMCACHE_CONFIG_FILE": "/nonexistent/lmcache.yaml"}, "cannot read it")],
)  # fmt: skip
def test_a_bad_lmcache_config_names_its_key(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)


def test_the_flag_builds_the_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "1")
    flags = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096",
             "--kv-transfer-config", LMCACHE]  # fmt: skip
    values, _ = resolve(parse_flags(flags), ALL, environ={})
    config = engine_config_from(values)
    assert config.offload.num_cpu_blocks == GIB // BLOCK_BYTES
    assert config.offload.chunk_blocks == 16


@pytest.mark.parametrize("disk", [False, True])
def test_a_working_set_past_the_device_comes_back_from_lmcache_in_whole_chunks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, disk: bool
) -> None:
    # Eight 600-token prompts (2 whole chunks of 256 and a partial one each) through a device
    # cache of 64 blocks, twice: round 2 finds each prompt's 512 chunked tokens in the CPU
    # tier and recomputes the partial chunk LMCache never stored. With a CPU tier of 64
    # blocks and a local disk, the early prompts come back from the disk.
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "0.125" if disk else "1")
    if disk:
        monkeypatch.setenv("LMCACHE_LOCAL_DISK", f"file://{tmp_path}/")
        monkeypatch.setenv("LMCACHE_MAX_LOCAL_DISK_SIZE", "1")
    flags = ["--num-gpu-blocks-override", "64", "--max-model-len", "1024",
             "--timing-model", "polynomial", "--kv-transfer-config", LMCACHE]  # fmt: skip
    values, _ = resolve(parse_flags(flags), ALL, environ={})
    core = EngineCore(engine_config_from(values))
    done = two_rounds(core)
    assert all(done[f"r0-{k}"].num_cached_tokens == 0 for k in range(8))
    assert [done[f"r1-{k}"].num_tier_cached_tokens for k in range(8)] == [512] * 8
    assert core.connector is not None and core.connector.stored_blocks == 8 * 32
    if disk:  # (the early prompts' chunks were found on the disk)
        assert core.connector.counters["fs"].block_hits > 0


def test_its_internal_api_server_opens_its_metrics() -> None:
    # LMCache's metrics' only door, off by default.
    assert parse_kv_transfer_config(LMCACHE, 16, 131072, environ={})["lmcache_api"] is None
    env = {"LMCACHE_INTERNAL_API_SERVER_ENABLED": "true"}
    settings = parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)
    assert settings["lmcache_api"] == ("127.0.0.1", 6999)  # LMCache's defaults
    env |= {"LMCACHE_INTERNAL_API_SERVER_HOST": "0.0.0.0",
            "LMCACHE_INTERNAL_API_SERVER_PORT_START": "7100"}  # fmt: skip
    settings = parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)
    assert settings["lmcache_api"] == ("0.0.0.0", 7100)
    env["LMCACHE_INTERNAL_API_SERVER_PORT_START"] = "70000"
    with pytest.raises(ConfigError, match="internal_api_server_port_start=70000"):
        parse_kv_transfer_config(LMCACHE, 16, 131072, environ=env)
