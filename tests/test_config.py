"""Config defaults, validation messages and combinations."""

from typing import Any

import pytest

from mocker.config import ConfigError, EngineConfig
from mocker.config_choices import EvictionPolicyName, PreemptionVictim
from mocker.model_shape import MODEL_PRESETS, ModelShape


def test_vllm_defaults() -> None:
    c = EngineConfig()
    assert (c.block_size, c.cache.num_gpu_blocks, c.scheduler.max_num_seqs) == (16, 16384, 256)
    assert (c.scheduler.max_num_batched_tokens, c.scheduler.max_model_len) == (8192, 131072)
    assert c.cache.enable_prefix_caching and c.scheduler.enable_chunked_prefill
    assert c.scheduler.preemption_victim is PreemptionVictim.NEWEST
    assert c.cache.eviction_policy is EvictionPolicyName.LRU
    assert c.speedup_ratio == 1.0 and c.seed == 0


def test_llama3_8b_kv_bytes() -> None:
    shape = EngineConfig().model
    assert shape == MODEL_PRESETS["llama-3-8b"]
    assert shape.kv_bytes_per_token == 131072
    assert EngineConfig().block_bytes == 2 * 1024 * 1024


def test_strings_coerce_to_enums() -> None:
    c = EngineConfig.of(preemption_victim="oldest", eviction_policy="lineage")
    assert c.scheduler.preemption_victim is PreemptionVictim.OLDEST
    assert c.cache.eviction_policy is EvictionPolicyName.LINEAGE


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": 24}, "power of two"),
        ({"num_gpu_blocks": -5}, "num_gpu_blocks"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"speedup_ratio": 0}, "speedup_ratio"),
        ({"speedup_ratio": float("inf")}, "speedup_ratio"),
        ({"speedup_ratio": True}, "speedup_ratio"),
        ({"seed": -1}, "seed"),
        ({"eos_probability": 1.5}, "eos_probability"),
        ({"preemption_victim": "random"}, "newest, oldest"),
        ({"eviction_policy": "fifo"}, "lru, lineage"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
        ({"max_num_batched_tokens": 128, "max_num_seqs": 256}, "max_num_seqs (256)"),
        (
            {"enable_chunked_prefill": False},
            "max_num_batched_tokens (8192) is smaller than max_model_len (131072)",
        ),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"num_cpu_blocks": 8, "enable_prefix_caching": False}, "CPU tier .* needs prefix"),
        ({"offload_policy": "lazy"}, "evict, write-through"),
        ({"offload_batch_size": 0}, "offload_batch_size"),
        ({"min_load_blocks": 0}, "min_load_blocks"),
        ({"load_timeout": 0.0}, "load_timeout"),
        ({"transfer_latency_ms": -1.0}, "transfer_latency_ms"),
        ({"cpu_write_gbps": float("nan")}, "cpu_write_gbps"),
    ],
)
def test_invalid_settings_name_the_setting(changes: dict[str, Any], names: str) -> None:
    pattern = names if ".*" in names else names.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ConfigError, match=pattern):
        EngineConfig.of(**changes)


def test_chunked_prefill_off_is_fine_when_budget_covers_context() -> None:
    c = EngineConfig.of(enable_chunked_prefill=False, max_model_len=8192)
    assert not c.scheduler.enable_chunked_prefill


def test_model_shape_validation() -> None:
    with pytest.raises(ConfigError, match="dtype_bytes"):
        ModelShape(dtype_bytes=3)
    with pytest.raises(ConfigError, match="num_layers"):
        ModelShape(num_layers=0)


def test_with_changes_validates_and_rejects_unknown() -> None:
    c = EngineConfig().with_changes(block_size=32)
    assert c.block_size == 32
    with pytest.raises(ConfigError, match="unknown setting"):
        EngineConfig().with_changes(blocksize=32)
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig().with_changes(block_size=3)


def test_disable_hybrid_kv_cache_manager_keeps_every_layer_as_full_attention() -> None:
    # vLLM's unify_hybrid_kv_cache_specs: a sliding-window model's layers all get full
    # attention's KV (one group, nothing released outside the window); a model with Mamba
    # layers does not start (hybrid SSM models need the hybrid manager).
    gpt_oss = MODEL_PRESETS["gpt-oss-20b"]
    hybrid = EngineConfig.of(model=gpt_oss, num_gpu_blocks=1000)
    assert hybrid.is_hybrid and len(hybrid.layout.groups) == 2
    unified = EngineConfig.of(
        model=gpt_oss, num_gpu_blocks=1000, disable_hybrid_kv_cache_manager=True
    )
    assert not unified.is_hybrid and len(unified.layout.groups) == 1
    assert unified.model.num_layers == gpt_oss.num_layers
    assert unified.block_bytes == gpt_oss.kv_bytes_per_token * unified.block_size
    with pytest.raises(ConfigError, match="Mamba layers needs the hybrid KV cache manager"):
        EngineConfig.of(model=MODEL_PRESETS["qwen3-next-80b-a3b"], num_gpu_blocks=100,
                     disable_hybrid_kv_cache_manager=True)  # fmt: skip
