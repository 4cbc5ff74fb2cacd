"""NVIDIA Dynamo mocker's published pass-time polynomial (`--timing-model polynomial`)."""

from __future__ import annotations

from mocker.timing.shape import PassShape

__all__ = ["PolynomialTiming"]


class PolynomialTiming:
    """Dynamo mocker's fits (its `lib/mocker` perf model), in ms: prefill
    4.209989e-7·t² + 1.518344e-2·t + 16.50142 for t new prompt tokens (0 for none); decode
    -25.74·u² + 54.01·u + 5.74 for u = active / total KV tokens, at least 1 ms; a pass is
    the sum (the decode term only when a request decodes). The same for every model and GPU."""

    __slots__ = ()

    reads_context = False

    def prefill_ms(self, new_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        t = float(new_tokens)
        return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142

    def decode_ms(self, active_kv_tokens: int, total_kv_tokens: int, num_decodes: int) -> float:
        if num_decodes <= 0:
            return 0.0
        u = active_kv_tokens / total_kv_tokens if total_kv_tokens > 0 else 0.0
        return max(1.0, -25.74 * u * u + 54.01 * u + 5.74)

    def pass_ms(self, shape: PassShape) -> float:
        return self.prefill_ms(shape.prefill_tokens) + self.decode_ms(
            shape.active_kv_tokens, shape.total_kv_tokens, shape.num_decodes
        )
