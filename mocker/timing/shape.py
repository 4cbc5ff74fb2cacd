"""What a pass computes, as its duration sees it, and the interface every timing model offers."""

from __future__ import annotations

from typing import NamedTuple, Protocol

__all__ = ["PassShape", "TimingModel", "pass_duration_s"]


class PassShape(NamedTuple):
    """A pass's composition. Context counts are tokens already in the KV cache that the
    pass's attention reads: a prefill chunk's earlier tokens (prefix hits and earlier
    chunks), and each decode's whole sequence so far."""

    prefill_tokens: int  # new (uncached) prompt tokens computed in this pass
    prefill_requests: int  # requests with a prefill chunk in this pass
    prefill_context: int  # sum over those chunks of the tokens before them
    num_decodes: int  # requests producing a decode token in this pass
    decode_context: int  # sum over those of their KV tokens (this pass's token included)
    active_kv_tokens: int  # KV tokens held by requests (blocks in use × block size)
    total_kv_tokens: int  # the device pool's capacity in tokens


class TimingModel(Protocol):
    """Unscaled milliseconds of a pass (a pure function of its shape)."""

    @property
    def reads_context(self) -> bool:
        """Whether a pass's time depends on its context counts (else only on the blocks in
        use): a replay then times each decode pass, not each change of the pool."""
        ...

    def pass_ms(self, shape: PassShape) -> float: ...

    def prefill_ms(self, new_tokens: int) -> float:
        """A pass that only computes `new_tokens` of one prompt (what recomputing blocks
        instead of loading them costs)."""
        ...


def pass_duration_s(model: TimingModel, shape: PassShape, speedup_ratio: float) -> float:
    """Simulated seconds for one pass; the speedup ratio divides the whole duration."""
    return model.pass_ms(shape) / 1000.0 / speedup_ratio
