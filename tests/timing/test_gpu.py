"""Pass times from aiconfigurator-core's measured kernels: its own answers, following the model,
the GPU and the parallelism, and the pass's composition."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

from mocker.deployment import Deployment, deployment_from
from mocker.timing import (
    CorrectedTiming,
    Correction,
    GpuTiming,
    PassShape,
    RooflineTiming,
    TimingSpec,
    load_timing_model,
)
from mocker.timing.gpu import aic_config
from mocker.timing.serving import SERVING
from mocker.timing.spec import TimingKind


def _gpu(model: str, gpu: str = "h100_sxm", **kw: Any) -> GpuTiming:
    """The kernel data's model (without the serving correction the engine applies)."""
    model_ = load_timing_model(TimingSpec(TimingKind.GPU, deployment_from(model, gpu, **kw)))
    assert isinstance(model_, CorrectedTiming) and model_.correction is SERVING
    assert isinstance(model_.base, GpuTiming)
    return model_.base


def test_the_engine_adds_servings_costs_to_the_kernels(tmp_path: Path) -> None:
    dep = deployment_from("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm")
    served = load_timing_model(TimingSpec(TimingKind.GPU, dep))
    kernels = _gpu("meta-llama/Llama-3.1-8B-Instruct")
    decode, prefill = _decode(32, 1000), _prefill(2048)
    assert served.pass_ms(decode) == pytest.approx(
        SERVING.decode_scale * kernels.pass_ms(decode)
        + SERVING.overhead_ms
        + 32 * SERVING.request_ms
    )
    assert served.pass_ms(prefill) == pytest.approx(
        SERVING.prefill_scale * kernels.pass_ms(prefill) + SERVING.overhead_ms + SERVING.request_ms
    )
    assert served.pass_ms(prefill) > kernels.pass_ms(prefill)
    # A user's correction profile replaces it (fitted from the kernels, as calibrate does).
    own = tmp_path / "own.json"
    own.write_text(Correction(decode_scale=1.1).to_json())
    mine = load_timing_model(TimingSpec.with_profile("gpu", dep, str(own)))
    assert isinstance(mine, CorrectedTiming) and isinstance(mine.base, GpuTiming)
    assert mine.pass_ms(decode) == pytest.approx(1.1 * kernels.pass_ms(decode))


def _decode(n: int, ctx: int) -> PassShape:
    return PassShape(0, 0, 0, n, n * ctx, 0, 0)


def _prefill(tokens: int, prefix: int = 0) -> PassShape:
    return PassShape(tokens, 1, prefix, 0, 0, 0, 0)


def test_the_answers_are_the_librarys_own() -> None:
    dep = deployment_from("meta-llama/Llama-3.1-70B", "h100_sxm", tensor_parallel_size=4,
                          quantization="fp8")  # fmt: skip
    raw = RustForwardPassPerfModel.from_native(aic_config(dep))
    model = _gpu("meta-llama/Llama-3.1-70B", tensor_parallel_size=4, quantization="fp8")

    def library(**scheduled: int) -> float:
        ms = raw.estimate_forward_pass_time_ms({"scheduled_requests": scheduled})
        assert ms is not None
        return ms

    # Counts that are their own memo step ask for exactly themselves.
    assert model.pass_ms(_prefill(1024)) == library(sum_prefill_tokens=1024, num_prefill_requests=1)
    # A decode pass's mean context is timed at the middle of its step (1984-2015 here).
    assert model.pass_ms(_decode(32, 2000)) == library(num_decode_requests=32,
                                                       sum_decode_kv_tokens=32 * 2000)  # fmt: skip
    # Prefixes of 1000 a chunk: step 992-1007 (middle 1000); contexts of 1500: 1472-1503.
    mixed = PassShape(512, 2, 2 * 1000, 30, 30 * 1500, 0, 0)
    assert model.pass_ms(mixed) == pytest.approx(library(
        sum_prefill_tokens=512, num_prefill_requests=2, sum_prefill_kv_tokens=2 * 1000,
        num_decode_requests=30, sum_decode_kv_tokens=30 * 1488), rel=1e-9)  # fmt: skip


def test_time_follows_the_model_gpu_parallelism_and_precision() -> None:
    decode = _decode(32, 2000)
    big = _gpu("meta-llama/Llama-3.1-70B", tensor_parallel_size=4)
    assert _gpu("meta-llama/Llama-3.1-8B-Instruct").pass_ms(decode) < big.pass_ms(decode)
    tp8 = _gpu("meta-llama/Llama-3.1-70B", tensor_parallel_size=8)
    assert tp8.pass_ms(decode) < big.pass_ms(decode)
    fp8 = _gpu("meta-llama/Llama-3.1-70B", tensor_parallel_size=4, quantization="fp8")
    assert fp8.pass_ms(decode) < big.pass_ms(decode)
    b200 = _gpu("meta-llama/Llama-3.1-70B", "b200_sxm", tensor_parallel_size=4)
    assert b200.pass_ms(decode) < big.pass_ms(decode)
    # More context read, more requests, longer chunks, more prefix: never faster.
    assert big.pass_ms(_decode(32, 8000)) > big.pass_ms(decode)
    assert big.pass_ms(_decode(128, 2000)) > big.pass_ms(decode)
    assert big.pass_ms(_prefill(4096)) > 3 * big.pass_ms(_prefill(1024))
    assert big.pass_ms(_prefill(1024, 8192)) > big.pass_ms(_prefill(1024))
    both = PassShape(1024, 1, 0, 32, 32 * 2000, 0, 0)
    assert big.pass_ms(both) > max(big.pass_ms(decode), big.pass_ms(_prefill(1024)))
    assert big.prefill_ms(1024) == big.pass_ms(_prefill(1024)) and big.prefill_ms(0) == 0.0
    assert big.pass_ms(PassShape(0, 0, 0, 0, 0, 0, 0)) == 0.0


def test_equal_specs_share_one_model_and_steps_share_answers() -> None:
    a = _gpu("meta-llama/Llama-3.1-8B-Instruct")
    assert _gpu("meta-llama/Llama-3.1-8B-Instruct") is a
    # Mean contexts of 1990 and 2010 share a memoised step (1984-2015: 32 tokens wide).
    assert a.pass_ms(_decode(8, 1990)) == a.pass_ms(_decode(8, 2010))
    assert a.pass_ms(_decode(8, 2000)) != a.pass_ms(_decode(8, 2200))


def test_a_gpu_without_vllm_data_is_timed_by_a_roofline_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dep = deployment_from("meta-llama/Llama-3.1-8B-Instruct", "h100_pcie")
    with caplog.at_level(logging.WARNING, logger="mocker"):
        model = load_timing_model(TimingSpec(TimingKind.GPU, dep))
    assert isinstance(model, RooflineTiming)
    assert "cannot time meta-llama/Llama-3.1-8B-Instruct" in caplog.text
    assert "no measured vLLM kernels for h100_pcie" in caplog.text and "roofline" in caplog.text


def test_a_pass_the_data_cannot_answer_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = GpuTiming(deployment_from("Qwen/Qwen3-8B", "h100_sxm"))

    class Broken:
        def estimate_forward_pass_time_ms(self, metrics: object) -> float:
            raise ValueError("perf database error: out of range")

    monkeypatch.setattr(model, "_model", Broken())
    with caplog.at_level(logging.WARNING, logger="mocker"):
        first = model.pass_ms(_decode(4, 100))
        model.pass_ms(_decode(5, 100))
        # One memo step (mean context 96-103), two shapes: each the roofline's own time.
        near = model.pass_ms(_decode(4, 103))
    roofline = RooflineTiming(model._dep)
    assert first == roofline.pass_ms(_decode(4, 100))
    assert near == roofline.pass_ms(_decode(4, 103)) != first
    assert model.decode_span(4, 400) == (first, 1)
    assert caplog.text.count("cannot time some passes (perf database error") == 1


def test_moe_models_are_timed_with_their_experts_split_as_vllm_splits_them() -> None:
    dep: Deployment = deployment_from("Qwen/Qwen3-30B-A3B", "h100_sxm", tensor_parallel_size=2)
    assert (aic_config(dep)["moe_tp_size"], aic_config(dep)["moe_ep_size"]) == (2, 1)
    ep = deployment_from("Qwen/Qwen3-30B-A3B", "h100_sxm", tensor_parallel_size=2,
                         enable_expert_parallel=True)  # fmt: skip
    assert (aic_config(ep)["moe_tp_size"], aic_config(ep)["moe_ep_size"]) == (1, 2)
    assert _gpu("openai/gpt-oss-120b").pass_ms(_decode(16, 1000)) > 0


def test_a_decode_span_is_the_passes_that_share_its_answer() -> None:
    model = _gpu("meta-llama/Llama-3.1-8B-Instruct")
    n, context = 8, 8 * 1990
    ms, span = model.decode_span(n, context)
    assert span == 2016 - 1990  # the mean context's step is 1984-2015
    assert all(model.pass_ms(_decode(n, 1990 + k)) == ms for k in range(span))
    assert model.pass_ms(_decode(n, 1990 + span)) != ms
    assert model.decode_span(n, context + n * span)[1] == 32  # the next step, whole


def test_a_prefill_without_requests_is_a_callers_bug() -> None:
    with pytest.raises(ValueError, match="names no prefill request"):
        _gpu("meta-llama/Llama-3.1-8B-Instruct").pass_ms(PassShape(100, 0, 0, 0, 0, 0, 0))
