"""Pass times from first principles where no kernel data exists: the model's FLOPs and bytes over
the GPU's published peaks (a roofline), per rank."""

from __future__ import annotations

from mocker.deployment.capacity import weight_bytes
from mocker.deployment.spec import Deployment
from mocker.timing.shape import PassShape

__all__ = ["RooflineTiming"]

# Shares of the published peaks that serving kernels reach, and fixed costs per layer and
# per pass (kernel launches, the scheduler and the sampler): the usual assumptions of
# roofline estimates (aiconfigurator-core's own system files use 0.8 of the memory
# bandwidth); a roofline is an estimate, and mocker says so when it uses one.
GEMM_EFFICIENCY = 0.6
MEMORY_EFFICIENCY = 0.8
LAYER_OVERHEAD_MS = 0.01
PASS_OVERHEAD_MS = 1.0


class RooflineTiming:
    """max(compute, memory traffic) per rank, plus all-reduces across TP ranks."""

    reads_context = True

    def __init__(self, dep: Deployment) -> None:
        arch = dep.model
        ranks = dep.num_gpus
        self._tp = dep.tensor_parallel_size
        active = arch.num_params() - arch.embedding_params() // 2
        if arch.is_moe:
            per_layer_experts = arch.expert_params() // max(
                1, arch.num_layers - arch.first_dense_layers
            )
            used = per_layer_experts * arch.experts_per_token // arch.num_experts
            active -= (per_layer_experts - used) * (arch.num_layers - arch.first_dense_layers)
        self._flops_per_token = 2.0 * active / ranks
        # Attention: QK^T and AV, 4 FLOPs per head dimension per (query, key) pair.
        self._attn_flops = 4.0 * arch.num_layers * arch.num_heads * arch.head_dim / ranks
        self._weights = weight_bytes(dep) / ranks
        share = max(1, arch.num_kv_heads // self._tp) / arch.num_kv_heads
        self._kv_per_token = (arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim
                              * dep.kv_bytes * share / dep.pipeline_parallel_size)  # fmt: skip
        compute = "fp4" if dep.weights.needs_fp4 else "fp8" if dep.weights.name == "fp8" else None
        peak = dep.gpu.flop_rate(compute or "bfloat16") or dep.gpu.flop_rate("bfloat16") or 1e14
        self._flops = peak * GEMM_EFFICIENCY
        self._bw = dep.gpu.mem_bw * MEMORY_EFFICIENCY
        self._link = dep.gpu.link_bw
        self._hidden_bytes = arch.hidden_size * 2
        self._layers = arch.num_layers / dep.pipeline_parallel_size
        self.source = f"a roofline of {dep.model.name} on {dep.gpu.name}'s published peaks"

    def pass_ms(self, shape: PassShape) -> float:
        tokens = shape.prefill_tokens + shape.num_decodes
        if not tokens:
            return 0.0
        p = shape.prefill_tokens
        prefill_pairs = p * (shape.prefill_context + p / 2 / max(1, shape.prefill_requests))
        flops = self._flops_per_token * tokens + self._attn_flops * (
            prefill_pairs + shape.decode_context
        )
        kv_read = self._kv_per_token * (shape.decode_context + shape.prefill_context)
        memory = self._weights + kv_read
        seconds = max(flops / self._flops, memory / self._bw)
        if self._tp > 1 and self._link > 0:
            # Two ring all-reduces a layer of the pass's hidden states.
            moved = 2 * self._layers * 2 * tokens * self._hidden_bytes * (self._tp - 1) / self._tp
            seconds += moved / self._link
        return seconds * 1000.0 + self._layers * LAYER_OVERHEAD_MS + PASS_OVERHEAD_MS

    def prefill_ms(self, new_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        return self.pass_ms(PassShape(new_tokens, 1, 0, 0, 0, 0, 0))
