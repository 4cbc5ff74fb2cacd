"""The model dimensions that size the KV cache, and the presets mocker knows by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mocker.errors import ConfigError
from mocker.kv.spec import SpecKind, gated_delta_net_state_bytes, layer_kind, mamba2_state_bytes
from mocker.validation import fail, int_in

__all__ = ["MODEL_PRESETS", "ModelShape"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The model dimensions that size the KV cache (no weights are ever loaded).

    A hybrid model lists each layer's type (`layer_types`, as its config.json does):
    full attention, sliding-window attention (`sliding_window` tokens), or Mamba / linear
    attention, whose per-request state is `mamba_state_bytes` per layer whatever the
    context. Only layers that hold KV are listed (an MLP-only layer has none).
    """

    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    layer_types: tuple[str, ...] = ()  # empty: every layer is full attention
    sliding_window: int | None = None
    mamba_state_bytes: int = 0

    def __post_init__(self) -> None:
        int_in("num_layers", self.num_layers, 1, 1024)
        int_in("num_kv_heads", self.num_kv_heads, 1, 1024)
        int_in("head_dim", self.head_dim, 1, 4096)
        if self.dtype_bytes not in (1, 2, 4):
            fail("dtype_bytes", self.dtype_bytes, "must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32)")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types and len(self.layer_types) != self.num_layers:
            fail("layer_types", list(self.layer_types),
                  f"must list one type per layer (num_layers={self.num_layers})")  # fmt: skip
        try:
            kinds = {layer_kind(t) for t in self.layer_types} or {SpecKind.FULL}
        except ValueError as exc:
            raise ConfigError(f"invalid layer_types: {exc}") from None
        if SpecKind.SLIDING in kinds:
            int_in("sliding_window", self.sliding_window, 1, 1 << 24)
        elif self.sliding_window is not None:
            fail("sliding_window", self.sliding_window, "set without a sliding_attention layer")
        if SpecKind.MAMBA in kinds:
            int_in("mamba_state_bytes", self.mamba_state_bytes, 1, 1 << 40)
        elif self.mamba_state_bytes:
            fail("mamba_state_bytes", self.mamba_state_bytes, "set without a mamba layer")

    @property
    def num_attention_layers(self) -> int:
        if not self.layer_types:
            return self.num_layers
        return sum(1 for t in self.layer_types if layer_kind(t) is not SpecKind.MAMBA)

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V per attention layer per KV head: layers × 2 × kv_heads × head_dim × bytes.
        return self.num_attention_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def is_hybrid(self) -> bool:
        return any(layer_kind(t) is not SpecKind.FULL for t in self.layer_types)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ModelShape:
        """A custom shape from JSON/YAML (docs/hybrid.md): ModelShape's
        fields, and instead of mamba_state_bytes either `mamba2` (intermediate, n_groups,
        d_state, d_conv, n_heads, head_dim[, conv_bytes, ssm_bytes]) or `gated_delta_net`
        (num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel[, dtype_bytes]),
        from which the state's bytes are computed as vLLM sizes it."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a model shape must be an object, got {raw!r}")
        values = dict(raw)
        known = {f.name for f in fields(cls)} | {"mamba2", "gated_delta_net"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown model shape key(s) {', '.join(unknown)}: known are "
                + ", ".join(sorted(known))
            )
        for key, state_fn in (("mamba2", mamba2_state_bytes),
                              ("gated_delta_net", gated_delta_net_state_bytes)):  # fmt: skip
            if key in values:
                params = values.pop(key)
                if "mamba_state_bytes" in values or not isinstance(params, Mapping):
                    raise ConfigError(
                        f"model shape: {key} must be an object, and comes instead of "
                        "mamba_state_bytes"
                    )
                for name, value in params.items():
                    # A convolution of width k keeps k − 1 inputs: at least 2.
                    low = 2 if name in ("d_conv", "conv_kernel") else 1
                    int_in(f"{key}.{name}", value, low, 1 << 24)
                try:
                    values["mamba_state_bytes"] = state_fn(**params)
                except TypeError as exc:
                    raise ConfigError(f"model shape: {key}: {exc}") from None
        if "layer_types" in values:
            types = values["layer_types"]
            if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
                raise ConfigError("model shape: layer_types must be a list of strings")
            values["layer_types"] = tuple(types)
        return cls(**values)


# Dense presets: every layer full attention. Hybrid ones from the models' config.json:
MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "llama-3-70b": ModelShape(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "qwen2.5-7b": ModelShape(num_layers=28, num_kv_heads=4, head_dim=128, dtype_bytes=2),
    "mistral-7b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    # huggingface.co/openai/gpt-oss-20b/blob/main/config.json: num_hidden_layers 24,
    # num_key_value_heads 8, head_dim 64, sliding_window 128, layer_types alternating
    # sliding_attention / full_attention from layer 0; bf16 KV.
    "gpt-oss-20b": ModelShape(
        num_layers=24,
        num_kv_heads=8,
        head_dim=64,
        dtype_bytes=2,
        layer_types=("sliding_attention", "full_attention") * 12,
        sliding_window=128,
    ),
    # huggingface.co/google/gemma-3-12b-it/blob/main/config.json text_config (with
    # transformers' Gemma3TextConfig defaults): num_hidden_layers 48, num_key_value_heads 8,
    # head_dim 256, sliding_window 1024, sliding_window_pattern 6 (five sliding layers,
    # then one full).
    "gemma-3-12b": ModelShape(
        num_layers=48,
        num_kv_heads=8,
        head_dim=256,
        dtype_bytes=2,
        layer_types=(("sliding_attention",) * 5 + ("full_attention",)) * 8,
        sliding_window=1024,
    ),
    # huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json:
    # num_hidden_layers 48, full_attention_interval 4 (layers 3, 7, ... full attention, the
    # rest Gated DeltaNet), num_key_value_heads 2, head_dim 256, linear_num_key_heads 16,
    # linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128,
    # linear_conv_kernel_dim 4; bf16 state: 1,097,728 bytes per linear-attention layer.
    "qwen3-next-80b-a3b": ModelShape(
        num_layers=48,
        num_kv_heads=2,
        head_dim=256,
        dtype_bytes=2,
        layer_types=(("linear_attention",) * 3 + ("full_attention",)) * 12,
        mamba_state_bytes=gated_delta_net_state_bytes(
            num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4
        ),
    ),
    # huggingface.co/ibm-granite/granite-4.0-h-micro/blob/main/config.json:
    # num_hidden_layers 40 (attention at 5, 15, 25, 35, Mamba2 elsewhere), hidden_size 2048,
    # num_attention_heads 32 (head_dim 64), num_key_value_heads 8, mamba_n_heads 64,
    # mamba_d_head 64, mamba_d_state 128, mamba_n_groups 1, mamba_d_conv 4, mamba_expand 2;
    # bf16 state: 1,074,688 bytes per Mamba layer.
    "granite-4.0-h-micro": ModelShape(
        num_layers=40,
        num_kv_heads=8,
        head_dim=64,
        dtype_bytes=2,
        layer_types=tuple("full_attention" if i % 10 == 5 else "mamba" for i in range(40)),
        mamba_state_bytes=mamba2_state_bytes(
            intermediate=4096, n_groups=1, d_state=128, d_conv=4, n_heads=64, head_dim=64
        ),
    ),
}
