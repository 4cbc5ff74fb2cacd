"""Weight formats (vLLM's --quantization names) and KV cache dtypes: bytes, and the data's names."""

from __future__ import annotations

from dataclasses import dataclass

from mocker.errors import ConfigError

__all__ = [
    "BF16",
    "KV_CACHE_DTYPES",
    "QUANTIZATIONS",
    "WeightFormat",
    "kv_dtype_bytes",
    "weight_format",
]


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How a checkpoint stores its linear layers: bytes a parameter, and the names
    aiconfigurator-core's data uses for its dense GEMMs and its experts."""

    name: str
    bytes_per_param: float
    gemm_dtype: str | None  # None: the model's own (16-bit)
    moe_dtype: str | None
    experts_only: bool = False  # only the routed experts are packed (MXFP4 checkpoints)
    needs_fp4: bool = False  # a Blackwell tensor core format


# 4-bit formats carry a scale per group: NVFP4 one FP8 scale per 16 weights (4.5 bits),
# MXFP4 one 8-bit scale per 32 (4.25 bits), AWQ / GPTQ a 16-bit one per 128 (4.125 bits).
_FORMATS = {
    "bf16": WeightFormat("bf16", 2.0, None, None),
    "fp8": WeightFormat("fp8", 1.0, "fp8", "fp8"),
    "nvfp4": WeightFormat("nvfp4", 4.5 / 8, "nvfp4", "nvfp4", needs_fp4=True),
    "mxfp4": WeightFormat("mxfp4", 4.25 / 8, None, "w4a16_mxfp4", experts_only=True),
    "int4": WeightFormat("int4", 4.125 / 8, "int4", "int4_wo"),
    "int8": WeightFormat("int8", 1.0, "int8", None),
}

BF16 = _FORMATS["bf16"]

# vLLM's --quantization names (and mocker's short ones) by the format they load.
QUANTIZATIONS: dict[str, str] = {
    "fp8": "fp8",
    "fp8_per_tensor": "fp8",
    "fp8_per_channel": "fp8",
    "fp8_per_block": "fp8",
    "fbgemm_fp8": "fp8",
    "modelopt": "fp8",
    "modelopt_fp4": "nvfp4",
    "nvfp4": "nvfp4",
    "fp4": "nvfp4",
    "mxfp4": "mxfp4",
    "gpt_oss_mxfp4": "mxfp4",
    "awq": "int4",
    "awq_marlin": "int4",
    "auto_awq": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "auto_gptq": "int4",
    "int4": "int4",
    "int8": "int8",
    "experts_int8": "int8",
}

# vLLM's --kv-cache-dtype values mocker sizes, by bytes per element ("auto": the model's).
KV_CACHE_DTYPES: dict[str, int] = {
    "auto": 2,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def weight_format(quantization: str | None, native: str | None) -> WeightFormat:
    """The format the weights load in: --quantization if given (it must agree with a
    quantized checkpoint's own, as vLLM checks), else the checkpoint's, else 16-bit."""
    if quantization is None or quantization == "auto":
        return _FORMATS[native or "bf16"]
    name = QUANTIZATIONS.get(quantization.strip().lower())
    if name is None:
        raise ConfigError(
            f"invalid quantization={quantization!r}: must be one of {', '.join(QUANTIZATIONS)}"
        )
    if native is not None and native != name:
        raise ConfigError(
            f"invalid quantization={quantization!r}: the checkpoint is quantized as {native} "
            "(vLLM refuses a --quantization that differs from the model config's)"
        )
    return _FORMATS[name]


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes of one KV element for --kv-cache-dtype."""
    size = KV_CACHE_DTYPES.get(kv_cache_dtype.strip().lower())
    if size is None:
        raise ConfigError(
            f"invalid kv_cache_dtype={kv_cache_dtype!r}: mocker sizes {', '.join(KV_CACHE_DTYPES)}"
        )
    return size
