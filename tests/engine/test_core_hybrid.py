"""A hybrid model's pass duration: each group's attention work, hand-computed."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.model_shape import MODEL_PRESETS
from mocker.request import EngineRequest, SamplingParams


def poly_prefill_ms(t: int) -> float:
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


def poly_decode_ms(u: float) -> float:
    return max(1.0, -25.74 * u * u + 54.01 * u + 5.74)


def durations(config: EngineConfig, prompt_len: int, passes: int) -> list[float]:
    core = EngineCore(config)
    sampling = SamplingParams(max_tokens=50, ignore_eos=True)
    core.add_request(EngineRequest("r", list(range(100, 100 + prompt_len)), sampling))
    out, t = [], 0.0
    for _ in range(passes):
        result = core.step(t)
        out.append(result.end - result.start)
        t = result.end
    return out


def test_a_sliding_window_caps_the_context_a_decode_reads() -> None:
    # gpt-oss-20b: 24 layers in two groups of 12 (sliding window 128, full), block 16, a
    # pool of 1000 blocks. Weight: group_size / num_layers = 12 / 24 = 0.5; the pool holds
    # 0.5 × 16 × 1000 = 8000 whole-model KV tokens.
    config = EngineConfig.of(model=MODEL_PRESETS["gpt-oss-20b"], num_gpu_blocks=1000,
                          max_model_len=4096)  # fmt: skip
    prefill, decode = durations(config, 1000, 2)
    # Pass 1: the whole 1000-token prompt (no decode term).
    assert prefill == pytest.approx(poly_prefill_ms(1000) / 1000)
    # Pass 2 decodes token 1001. Before it, the sliding group released the blocks wholly
    # before 1000 − 128 + 1 = 873: 873 // 16 = 54 of its 63, keeping 9; the full group keeps
    # all 63 (1001 tokens need no 64th). Attention reads (63 + 9) blocks × 16 × 0.5 = 576
    # tokens: u = 576 / 8000 = 0.072.
    assert decode == pytest.approx(poly_decode_ms(576 / 8000) / 1000)
    # Without the window (every layer full attention: 126 blocks read) it would be longer.
    assert decode < poly_decode_ms(126 * 16 * 0.5 / 8000) / 1000


def test_a_mamba_group_reads_nothing_that_grows_with_context() -> None:
    # qwen3-next-80b-a3b: 48 layers in four groups of 12 (three Mamba, one full), block 544,
    # a pool of 100 blocks: weight 12 / 48 = 0.25, 0.25 × 544 × 100 = 13600 tokens.
    config = EngineConfig.of(model=MODEL_PRESETS["qwen3-next-80b-a3b"], num_gpu_blocks=100,
                          max_model_len=8192)  # fmt: skip
    first, second, decode = durations(config, 2000, 3)
    # The prompt is split where its Mamba state is saved: 1632 = 3 × 544, then 368.
    assert first == pytest.approx(poly_prefill_ms(1632) / 1000)
    assert second == pytest.approx(poly_prefill_ms(368) / 1000)
    # The decode reads the full group's cdiv(2001, 544) = 4 blocks: 4 × 544 × 0.25 = 544
    # tokens, u = 544 / 13600 = 0.04. The Mamba groups' six state blocks (two each, the one
    # copied from is held for one more pass) read nothing that grows with context.
    assert decode == pytest.approx(poly_decode_ms(544 / 13600) / 1000)


def test_a_dense_model_keeps_its_formula() -> None:
    # llama-3-8b: active = used blocks × 16 (every layer), total = 1000 × 16.
    config = EngineConfig.of(num_gpu_blocks=1000, max_model_len=4096)
    _, decode = durations(config, 1000, 2)
    assert decode == pytest.approx(poly_decode_ms(63 * 16 / 16000) / 1000)
