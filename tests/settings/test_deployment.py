"""Deployment flags to the engine: KV capacity, layout and limits as vLLM derives them, the GPU
timing, and what start-up says."""

from __future__ import annotations

import logging

import pytest

from mocker.deployment import deployment_from, kv_capacity
from mocker.errors import ConfigError
from mocker.model_shape import ModelShape
from mocker.settings.deployment import arch_shape, listing, startup_lines
from mocker.timing import TimingKind
from tests.support.settings import serve_config

LLAMA_70B_TP4 = ("--model", "meta-llama/Llama-3.1-70B", "--tensor-parallel-size", "4",
                 "--quantization", "fp8")  # fmt: skip


def test_the_model_and_gpus_size_the_kv_cache_as_vllm() -> None:
    config = serve_config(*LLAMA_70B_TP4)
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=4,
                          quantization="fp8")  # fmt: skip
    expected = kv_capacity(dep, block_size=16, block_bytes=config.block_bytes,
                           max_num_batched_tokens=8192, max_num_seqs=1024,
                           max_model_len=131072)  # fmt: skip
    assert config.cache.num_gpu_blocks == expected.num_gpu_blocks
    assert config.model == ModelShape(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2)
    assert config.timing.kind is TimingKind.GPU and config.timing.deployment == dep
    # An FP8 KV cache holds twice the tokens in the same bytes; more GPUs, more again.
    fp8 = serve_config(*LLAMA_70B_TP4, "--kv-cache-dtype", "fp8")
    assert (
        fp8.model.dtype_bytes == 1 and fp8.cache.num_gpu_blocks > 1.9 * config.cache.num_gpu_blocks
    )
    tp8 = serve_config(*LLAMA_70B_TP4[:-4], "--tensor-parallel-size", "8", "--quantization", "fp8")
    assert tp8.cache.num_gpu_blocks > 2 * config.cache.num_gpu_blocks
    # The flags that size the cache directly still win, as in vLLM.
    assert serve_config(*LLAMA_70B_TP4, "--num-gpu-blocks-override", "1000",
                        "--max-model-len", "4096").cache.num_gpu_blocks == 1000  # fmt: skip
    # --kv-cache-memory-bytes is per GPU: a quarter of a 70B block (two of eight heads).
    per_gpu = serve_config(*LLAMA_70B_TP4, "--kv-cache-memory-bytes", str(2**30),
                           "--max-model-len", "4096")  # fmt: skip
    assert per_gpu.cache.num_gpu_blocks == 2**30 // (config.block_bytes // 4)


def test_vllms_limits_follow_the_gpu() -> None:
    h100 = serve_config()
    assert (h100.scheduler.max_num_batched_tokens, h100.scheduler.max_num_seqs) == (8192, 1024)
    b200 = serve_config("--gpu", "b200_sxm")
    assert (b200.scheduler.max_num_batched_tokens, b200.scheduler.max_num_seqs) == (16384, 1024)
    l40s = serve_config("--gpu", "l40s")
    assert (l40s.scheduler.max_num_batched_tokens, l40s.scheduler.max_num_seqs) == (2048, 256)
    qwen = serve_config("--model", "Qwen/Qwen3-32B", "--tensor-parallel-size", "2")
    assert qwen.scheduler.max_model_len == 40960  # its max_position_embeddings


def test_layouts_from_configs() -> None:
    oss = serve_config("--model", "openai/gpt-oss-120b", "--max-model-len", "8192")
    assert [g.kind.value for g in oss.layout.groups] == ["sliding_window", "full_attention"]
    ds = deployment_from("deepseek-ai/DeepSeek-V3", "b200_sxm", tensor_parallel_size=8)
    # MLA: one latent of 512 + 64 a token a layer, kept whole on every rank.
    assert arch_shape(ds).kv_bytes_per_token == 61 * (512 + 64) * 2
    qwen35 = deployment_from("Qwen/Qwen3.5-27B", "h100_sxm", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="not read from its config yet: give it with "
                       "--model-shape"):  # fmt: skip
        arch_shape(qwen35)
    # --model-shape gives the layout; the model still times the passes.
    shaped = serve_config("--model", "Qwen/Qwen3.5-27B", "--tensor-parallel-size", "2",
                          "--model-shape", "qwen3-next-80b-a3b",
                          "--max-model-len", "8192")  # fmt: skip
    assert shaped.layout.has_mamba and shaped.timing.kind is TimingKind.GPU


def test_the_polynomial_knows_no_deployment_and_says_what_it_ignores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="mocker"):
        config = serve_config("--timing-model", "polynomial", "--gpu", "b200_sxm",
                              "--tensor-parallel-size", "8")  # fmt: skip
    assert config.timing.deployment is None and config.cache.num_gpu_blocks == 16384
    assert "ignoring --gpu, --tensor-parallel-size: --timing-model polynomial" in caplog.text
    assert startup_lines(config) == [
        "timing: Dynamo mocker's polynomial (the same for every model and GPU)"
    ]


def test_start_up_says_what_vllm_logs() -> None:
    config = serve_config(*LLAMA_70B_TP4)
    lines = startup_lines(config)
    assert lines[0] == ("deployment: meta-llama/Llama-3.1-70B, on 4x h100_sxm, TP 4, "
                        "weights fp8, KV auto")  # fmt: skip
    assert lines[1] == (
        "timing: aiconfigurator-core's vLLM 0.24.0 data for h100_sxm, corrected for serving "
        "(decode x0.977, prefill x1.228, +0.38 ms a pass, +0.034 ms a request)"
    )
    assert lines[2].startswith("Model loading took 16.9") and "GiB memory" in lines[2]
    tokens = config.cache.num_gpu_blocks * 16
    assert lines[-1] == (f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                         f"131,072 tokens per request: {tokens / 131072:.2f}x")  # fmt: skip
    override = startup_lines(serve_config(*LLAMA_70B_TP4, "--num-gpu-blocks-override", "9000"))
    assert override[-1].startswith("GPU KV cache size: 144,000 tokens")


def test_list_tables() -> None:
    gpus = listing({"gpu": "list", "model": "x"})
    assert gpus is not None and "h100_sxm" in gpus and "none (timed by a roofline)" in gpus
    models = listing({"gpu": "h100_sxm", "model": "LIST"})
    assert models is not None and "Qwen/Qwen3-32B" in models
    assert "meta-llama/Llama-3.1-70B (= meta-llama/Meta-Llama-3.1-70B)" in models
    assert listing({"gpu": "h100_sxm", "model": "x"}) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "org/none"], "invalid model='org/none'"),
        (["--gpu", "h900"], "invalid gpu='h900'"),
        (["--model", "Qwen/Qwen3-32B", "--tensor-parallel-size", "3"], "divisible"),
        (["--quantization", "nvfp4"], "need FP4 tensor cores"),
        (["--model", "meta-llama/Llama-3.1-70B"], "No available memory for the cache blocks"),
        (["--timing-profile", "x.txt"], "a measured profile"),
    ],
)
def test_deployment_mistakes_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        serve_config(*argv)


def test_an_override_does_not_rescue_a_deployment_with_no_memory() -> None:
    with pytest.raises(ConfigError, match="No available memory for the cache blocks"):
        serve_config("--num-gpu-blocks-override", "1000", "--max-model-len", "4096",
                     "--gpu-memory-utilization", "0.1")  # fmt: skip
    with pytest.raises(ConfigError, match="invalid block_size=0"):
        serve_config("--block-size", "0")
