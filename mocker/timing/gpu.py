"""Pass times from measured GPU kernels: aiconfigurator-core's forward-pass model, memoised."""

from __future__ import annotations

import logging
from typing import Any

from mocker.deployment.spec import Deployment
from mocker.timing.roofline import RooflineTiming
from mocker.timing.shape import PassShape

__all__ = ["GpuDataUnavailable", "GpuTiming", "aic_config"]

# Memoised answers: a pass's mean context lengths are rounded to 1/32 of themselves and
# timed at the middle of their step; its prefill tokens are exact up to 2047, then within
# 1/1024, timed at the step's start (the data's GEMM times jump at powers of two, which a
# rounded count must not straddle). A replay's passes then share a few thousand answers,
# and a lookup is far cheaper than the library's estimate.
CONTEXT_BITS = 5
TOKEN_BITS = 10


def _step(value: int, bits: int) -> tuple[int, int]:
    """(value's bucket, the bucket's width): exact below 2**(bits + 1)."""
    shift = max(0, value.bit_length() - bits - 1)
    return value >> shift, shift


def _middle(bucket: int, shift: int) -> int:
    return (bucket << shift) + ((1 << shift) >> 1)


# aiconfigurator-core logs at WARNING which of its tables stand in for missing ones, once
# per table: what mocker uses is reported in one line of its own instead.
logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
logger = logging.getLogger(__name__)


class GpuDataUnavailable(Exception):
    """aiconfigurator-core cannot time this deployment (the reason is the message)."""


def aic_config(dep: Deployment) -> dict[str, Any]:
    """The forward-pass model's configuration for a deployment (vLLM's kernels on its GPU)."""
    tp = dep.tensor_parallel_size
    config: dict[str, Any] = {
        "schema_version": 1,
        "model_name": dep.model.aic_name,
        "system_name": dep.gpu.name,
        "backend": "vllm",
        "backend_version": dep.gpu.vllm_version,
        "tp_size": tp,
        "pp_size": dep.pipeline_parallel_size,
    }
    fmt = dep.weights
    if fmt.gemm_dtype is not None and not fmt.experts_only:
        config["weight_dtype"] = fmt.gemm_dtype
    if dep.model.is_moe:
        # vLLM shards the experts like every other layer (TP), or spreads them whole over
        # the ranks with --enable-expert-parallel (EP).
        config["moe_tp_size"] = 1 if dep.enable_expert_parallel else tp
        config["moe_ep_size"] = tp if dep.enable_expert_parallel else 1
        if fmt.moe_dtype is not None and fmt.name != "bf16":
            config["moe_dtype"] = fmt.moe_dtype
    if dep.kv_bytes == 1:
        config["kv_cache_dtype"] = "fp8"
    return config


class GpuTiming:
    """vLLM's pass time on the deployment's GPU, from aiconfigurator-core's measured kernel
    data: GEMMs, attention over each request's context, communication across TP ranks,
    composed for the pass's prefill chunks and decodes as one forward pass. A shape the
    data cannot answer (beyond its measured range) is timed by the roofline, with one
    warning."""

    reads_context = True

    def __init__(self, dep: Deployment) -> None:
        if dep.gpu.vllm_version is None:
            raise GpuDataUnavailable(
                f"aiconfigurator-core has no measured vLLM kernels for {dep.gpu.name}"
            )
        from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

        try:
            self._model = RustForwardPassPerfModel.from_native(aic_config(dep))
            self._memo: dict[tuple[int, ...], float] = {}
            self._fallback: RooflineTiming | None = None
            self._dep = dep
            # The first estimates of each kind load their tables: here, not in a pass.
            for key in ((1, 0, 1, 0, 0, 0, 0, 0), (1, 1, 0), (1, 0, 1, 0, 0, 1, 1, 0)):
                self._estimate(key)
        except Exception as exc:  # the library raises ValueError and its own error types
            raise GpuDataUnavailable(str(exc).splitlines()[0][:300]) from None
        self.source = f"aiconfigurator-core's vLLM {dep.gpu.vllm_version} data for {dep.gpu.name}"

    def pass_ms(self, shape: PassShape) -> float:
        p, n = shape.prefill_tokens, shape.num_decodes
        if p:
            r = shape.prefill_requests
            if r < 1:
                raise ValueError(f"a pass computing {p} prompt tokens names no prefill request")
            ctx = shape.decode_context // n if n else 0
            key: tuple[int, ...] = (*_step(p, TOKEN_BITS), r,
                                    *_step(shape.prefill_context // r, CONTEXT_BITS), n,
                                    *_step(ctx, CONTEXT_BITS))  # fmt: skip
        elif n:
            return self.decode_span(n, shape.decode_context)[0]
        else:
            return 0.0
        ms = self._memo.get(key)
        if ms is None:
            ms = self._memo[key] = self._estimate_or_roofline(key)
        if ms < 0.0:  # (the data has no answer for this key: the roofline's for this shape)
            return self._roofline().pass_ms(shape)
        return ms

    def decode_span(self, n: int, context: int) -> tuple[float, int]:
        """A pass of `n` decodes reading `context` tokens: its time, and how many passes from
        it on (each reading n more) share that answer (its mean context's memoised step)."""
        mean = context // n
        shift = max(0, mean.bit_length() - CONTEXT_BITS - 1)
        bucket = mean >> shift
        key = (n, bucket, shift)
        ms = self._memo.get(key)
        if ms is None:
            ms = self._memo[key] = self._estimate_or_roofline(key)
        if ms < 0.0:
            return self._roofline().pass_ms(PassShape(0, 0, 0, n, context, 0, 0)), 1
        return ms, ((bucket + 1) << shift) - mean

    def prefill_ms(self, new_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        return self.pass_ms(PassShape(new_tokens, 1, 0, 0, 0, 0, 0))

    def _estimate_or_roofline(self, key: tuple[int, ...]) -> float:
        """The data's answer for a memo key; -1 where it has none (each such pass is then the
        roofline's, for its own shape: one warning the first time)."""
        try:
            return self._estimate(key)
        except Exception as exc:  # (not while starting: then the deployment is refused)
            if self._fallback is None:
                logger.warning(
                    "aiconfigurator-core cannot time some passes (%s): a roofline times those",
                    str(exc).splitlines()[0][:200],
                )
                self._roofline()
            return -1.0

    def _roofline(self) -> RooflineTiming:
        if self._fallback is None:
            self._fallback = RooflineTiming(self._dep)
        return self._fallback

    def _estimate(self, key: tuple[int, ...]) -> float:
        scheduled: dict[str, int] = {}
        if len(key) == 3:
            n, ctx, ctx_shift = key
        else:
            p, p_shift, r, prefix, prefix_shift, n, ctx, ctx_shift = key
            scheduled = {"sum_prefill_tokens": p << p_shift,
                         "num_prefill_requests": r}  # fmt: skip
            if prefix:
                scheduled["sum_prefill_kv_tokens"] = r * _middle(prefix, prefix_shift)
        if n:
            scheduled["num_decode_requests"] = n
            scheduled["sum_decode_kv_tokens"] = n * max(1, _middle(ctx, ctx_shift))
        ms = self._model.estimate_forward_pass_time_ms({"scheduled_requests": scheduled})
        if ms is None or not ms >= 0.0:
            raise GpuDataUnavailable(f"aiconfigurator-core gave no time for a pass {scheduled}")
        return float(ms)
