"""The roofline where no kernel data exists: compute-bound prefills, memory-bound decodes."""

from __future__ import annotations

import pytest

from mocker.deployment import deployment_from
from mocker.deployment.capacity import weight_bytes
from mocker.timing import PassShape, RooflineTiming
from mocker.timing.roofline import (
    GEMM_EFFICIENCY,
    LAYER_OVERHEAD_MS,
    MEMORY_EFFICIENCY,
    PASS_OVERHEAD_MS,
)


def test_a_decode_reads_the_weights_and_a_prefill_computes() -> None:
    dep = deployment_from("meta-llama/Llama-3.1-8B-Instruct", "l4")  # no vLLM data for an L4
    roof = RooflineTiming(dep)
    fixed = 32 * LAYER_OVERHEAD_MS + PASS_OVERHEAD_MS
    # One decode at no context: the weights once over 80% of 300 GB/s.
    one = roof.pass_ms(PassShape(0, 0, 0, 1, 0, 0, 0))
    assert one == pytest.approx(weight_bytes(dep) / (300e9 * MEMORY_EFFICIENCY) * 1e3 + fixed)
    # A long prefill: 2 FLOPs a parameter a token (the LM head's half of the embeddings
    # left out) plus attention, over 60% of 121 TFLOPS.
    active = dep.model.num_params() - dep.model.embedding_params() // 2
    tokens = 8192
    attention = 4 * 32 * 32 * 128 * tokens * tokens / 2
    compute = (2 * active * tokens + attention) / (121e12 * GEMM_EFFICIENCY)
    assert roof.pass_ms(PassShape(tokens, 1, 0, 0, 0, 0, 0)) == pytest.approx(compute * 1e3 + fixed)
    assert roof.prefill_ms(tokens) == roof.pass_ms(PassShape(tokens, 1, 0, 0, 0, 0, 0))
    # Context read by decodes costs bandwidth; more GPUs, less time.
    assert roof.pass_ms(PassShape(0, 0, 0, 64, 64 * 8000, 0, 0)) > one
    tp2 = RooflineTiming(deployment_from("meta-llama/Llama-3.1-8B-Instruct", "l4",
                                         tensor_parallel_size=2))  # fmt: skip
    assert tp2.pass_ms(PassShape(0, 0, 0, 1, 0, 0, 0)) < one
