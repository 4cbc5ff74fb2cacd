"""Deployments checked as vLLM checks them: GPUs, parallelism, weight formats, KV dtypes."""

from __future__ import annotations

from typing import Any

import pytest

from mocker.deployment import deployment_from, gpu_spec, known_gpus
from mocker.deployment.precision import kv_dtype_bytes, weight_format
from mocker.errors import ConfigError


def test_gpus_come_from_the_system_files() -> None:
    h100 = gpu_spec("h100_sxm")
    assert h100.memory_bytes == 80 * 2**30 and h100.mem_bw == 3.35e12
    assert h100.flop_rate("fp8") == 1.978e15 and not h100.has_fp4
    assert gpu_spec("b200_sxm").has_fp4 and h100.vllm_version is not None
    assert gpu_spec("H200_SXM").name == "h200_sxm"
    assert known_gpus()["h100_pcie"].vllm_version is None  # no measured vLLM kernels
    with pytest.raises(ConfigError, match=r"invalid gpu='h900': must be one of .*h100_sxm"):
        gpu_spec("h900")


def test_weight_formats_follow_vllms_names_and_the_checkpoint() -> None:
    assert weight_format("fp8", None).bytes_per_param == 1.0
    assert weight_format("modelopt_fp4", None).name == "nvfp4"
    assert weight_format("awq", None).name == "int4"
    assert weight_format(None, "mxfp4").experts_only
    assert weight_format(None, None).bytes_per_param == 2.0
    with pytest.raises(ConfigError, match="invalid quantization='bitnet': must be one of fp8"):
        weight_format("bitnet", None)
    with pytest.raises(ConfigError, match="the checkpoint is quantized as fp8"):
        weight_format("awq", "fp8")
    assert kv_dtype_bytes("fp8_e4m3") == 1 and kv_dtype_bytes("auto") == 2
    with pytest.raises(ConfigError, match="invalid kv_cache_dtype='nvfp4_ds_mla'"):
        kv_dtype_bytes("nvfp4_ds_mla")


def test_a_deployment_describes_itself() -> None:
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=4,
                          quantization="fp8", kv_cache_dtype="fp8")  # fmt: skip
    assert dep.num_gpus == 4 and dep.kv_bytes == 1
    assert dep.describe() == ("meta-llama/Llama-3.1-70B, on 4x h100_sxm, TP 4, weights fp8, KV fp8")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tensor_parallel_size": 3}, r"heads \(64\) must be divisible by it.*divisors: 1, 2, 4"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size=0: must be an integer in"),
        ({"pipeline_parallel_size": 81}, "more stages than the model's 80 layers"),
        ({"quantization": "nvfp4"}, r"nvfp4 weights need FP4 tensor cores \(b200_sxm"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization=1.5: must be in \(0, 1\]"),
        ({"enable_expert_parallel": True}, "needs a mixture-of-experts model"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype='int3'"),
    ],
)
def test_what_vllm_refuses_is_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", **kwargs)
