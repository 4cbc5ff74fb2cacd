"""What a vLLM server spends beyond the kernels that aiconfigurator-core measured: the correction
GPU timing applies unless a correction profile replaces it."""

from __future__ import annotations

from mocker.timing.correction import Correction

__all__ = ["SERVING"]

# Fitted by bench/fit_serving.py (`mocker calibrate`'s fit) on the public InferenceX rows of
# Llama-3.1-70B on H100 and H200, from the kernel data alone. Prefill passes run slower in a
# server than their kernels' sum (launch gaps between the eager attention and the graphed
# pieces, the sampler, the logits); every request in a pass costs host time (its inputs,
# sampling, its output's processing). bench/silicon.py reports it on rows it was not fitted on.
SERVING = Correction(
    decode_scale=0.9774,
    prefill_scale=1.2277,
    overhead_ms=0.3758,
    request_ms=0.0337,
    deployment="vLLM serving (bench/fit_serving.py: Llama-3.1-70B on H100 and H200, InferenceX)",
)
