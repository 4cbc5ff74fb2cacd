"""KV capacity as vLLM computes it at start-up, by hand, and its refusals and log lines."""

from __future__ import annotations

from typing import Any

import pytest

from mocker.deployment import Deployment, KVCapacity, deployment_from, kv_capacity
from mocker.deployment.capacity import activation_bytes, weight_bytes
from mocker.errors import ConfigError

GIB = 2**30
# Llama-3.1-8B: a 16-token block of every layer's K and V, 8 KV heads of 128, bf16.
BLOCK_BYTES = 16 * 32 * 2 * 8 * 128 * 2
BLOCK_BYTES_70B = 16 * 80 * 2 * 8 * 128 * 2


def _kv70(dep: Deployment, max_model_len: int) -> KVCapacity:
    return kv_capacity(
        dep,
        block_size=16,
        block_bytes=BLOCK_BYTES_70B,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        max_model_len=max_model_len,
    )


def _capacity(util: float | None, **kw: Any) -> KVCapacity:
    dep = deployment_from("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm",
                          gpu_memory_utilization=util, **kw)  # fmt: skip
    return kv_capacity(dep, block_size=16, block_bytes=BLOCK_BYTES, max_num_batched_tokens=8192,
                       max_num_seqs=1024, max_model_len=131072)  # fmt: skip


def test_llama_8b_on_one_h100_by_hand() -> None:
    dep = deployment_from("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm")
    # Parameters: embeddings and LM head 2 × 128256 × 4096; per layer attention
    # 4096 × 32 × 128 × 2 + 4096 × 8 × 128 × 2 and MLP 3 × 4096 × 14336; 32 layers.
    params = 2 * 128256 * 4096 + 32 * (4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2
                                       + 3 * 4096 * 14336)  # fmt: skip
    assert params == 8_029_995_008 and weight_bytes(dep) == 2 * params
    # The profile run's peak: 8192 tokens of hidden states and gate/up projections, and the
    # fp32 logits and probabilities of 1024 requests.
    act = 8192 * (4 * 4096 + 2 * 14336) * 2 + 1024 * 128256 * 8
    assert activation_bytes(dep, 8192, 1024) == act
    # util 0.9: 80 GiB × 0.9, less the weights, 0.5 GiB non-torch, 0.5 GiB CUDA graphs, act.
    cap = _capacity(0.9)
    kv = int(80 * GIB * 0.9) - 2 * params - GIB - act
    assert cap.kv_bytes == kv and cap.num_gpu_blocks == kv // BLOCK_BYTES == 27841
    # vLLM 0.34's default (the extensible KV cache): everything, less a margin of
    # max(1 GiB, 0.75 × the peak) as well.
    margin = max(GIB, int(0.75 * act))
    kv = 80 * GIB - 2 * params - GIB - act - margin
    assert _capacity(None).num_gpu_blocks == kv // BLOCK_BYTES == 31297


def test_tensor_parallelism_splits_weights_and_kv_heads() -> None:
    one = _capacity(0.9)
    four = _capacity(0.9, tensor_parallel_size=4)
    # A quarter of the weights on each rank, a quarter of each block: more than 4x the blocks.
    assert four.block_bytes == BLOCK_BYTES // 4
    assert four.num_gpu_blocks > 4 * one.num_gpu_blocks
    # TP beyond the KV heads replicates them: 16 ranks hold one head each of the 8.
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=16)
    cap = _kv70(dep, 4096)
    assert cap.block_bytes == 16 * 80 * 2 * 1 * 128 * 2


def test_vllm_log_lines() -> None:
    cap = _capacity(0.9)
    lines = cap.log_lines(131072)
    assert lines[0] == f"Model loading took {2 * 8_029_995_008 / GIB:.4f} GiB memory"
    assert lines[1] == f"Available KV cache memory: {round(cap.kv_bytes / GIB, 2)} GiB"
    concurrency = 27841 / (131072 // 16)
    assert lines[2] == (
        f"GPU KV cache size: {int(concurrency * 131072):,} tokens, Maximum concurrency for "
        f"131,072 tokens per request: {concurrency:.2f}x"
    )


def test_a_model_that_does_not_fit_is_vllms_start_up_error() -> None:
    with pytest.raises(ConfigError, match=r"^No available memory for the cache blocks: .*131"):
        deployment = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm")
        _kv70(deployment, 131072)
    # 70B in FP8 on two H100s fits, but not with a context of ten million tokens.
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=2,
                          quantization="fp8", gpu_memory_utilization=0.9)  # fmt: skip
    with pytest.raises(ConfigError, match=r"To serve at least one request with the model's max "
                       r"seq len \(10000000\).*estimated maximum model length is \d+"):  # fmt: skip
        _kv70(dep, 10_000_000)


def test_pipeline_stages_are_sized_by_the_fullest() -> None:
    # 80 layers over 3 stages: 27, 27, 26; every rank holds as many blocks as the fullest.
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", pipeline_parallel_size=3,
                          tensor_parallel_size=2, quantization="fp8")  # fmt: skip
    cap = _kv70(dep, 4096)
    assert cap.block_bytes == int(BLOCK_BYTES_70B * (4 / 8) * 27 / 80)
    # Its weights: 27 layers' share and one of the embeddings and LM head, split over TP 2.
    embed = 2 * 128256 * 8192 * 2
    layers = (weight_bytes(dep) - embed) / 80
    assert cap.weights_bytes == int(layers * 27 + embed // 2) // 2
