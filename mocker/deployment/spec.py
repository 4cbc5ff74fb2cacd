"""What is deployed: a model on a GPU, its parallelism and precision, checked as vLLM does."""

from __future__ import annotations

from dataclasses import dataclass

from mocker.deployment.gpus import GpuSpec, gpu_spec, known_gpus
from mocker.deployment.models import ModelArch, resolve_model
from mocker.deployment.precision import BF16, WeightFormat, kv_dtype_bytes, weight_format
from mocker.errors import ConfigError

__all__ = ["Deployment", "deployment_from"]


@dataclass(frozen=True, slots=True)
class Deployment:
    """One engine's model, GPU, parallelism and precision (data parallelism is engines)."""

    model: ModelArch
    gpu: GpuSpec
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    weights: WeightFormat = BF16
    kv_cache_dtype: str = "auto"
    # None: vLLM 0.34's default (the extensible KV cache takes what the GPU has left).
    gpu_memory_utilization: float | None = None
    enable_expert_parallel: bool = False

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def kv_bytes(self) -> int:
        """Bytes of one KV element."""
        return kv_dtype_bytes(self.kv_cache_dtype)

    def describe(self) -> str:
        parts = [self.model.name, f"on {self.num_gpus}x {self.gpu.name}"]
        if self.tensor_parallel_size > 1:
            parts.append(f"TP {self.tensor_parallel_size}")
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP {self.pipeline_parallel_size}")
        parts.append(f"weights {self.weights.name}")
        parts.append(f"KV {self.kv_cache_dtype}")
        return ", ".join(parts)


def _positive(name: str, value: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(f"invalid {name}={value!r}: must be an integer in [1, {most}]")


def deployment_from(
    model: str,
    gpu: str,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    enable_expert_parallel: bool = False,
) -> Deployment:
    """The deployment the flags describe, with vLLM's start-up checks (a ConfigError names
    the flag and what it may be)."""
    arch = resolve_model(model)
    spec = gpu_spec(gpu)
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    _positive("tensor_parallel_size", tp, 1024)
    _positive("pipeline_parallel_size", pp, 1024)
    if arch.num_heads % tp:
        raise ConfigError(
            f"invalid tensor_parallel_size={tp}: the model's total number of attention heads "
            f"({arch.num_heads}) must be divisible by it (vLLM's check); divisors: "
            + ", ".join(str(d) for d in range(1, arch.num_heads + 1) if arch.num_heads % d == 0)
        )
    if pp > arch.num_layers:
        raise ConfigError(
            f"invalid pipeline_parallel_size={pp}: more stages than the model's "
            f"{arch.num_layers} layers"
        )
    fmt = weight_format(quantization, arch.native_quant)
    if fmt.needs_fp4 and not spec.has_fp4:
        fp4 = ", ".join(g for g, s in known_gpus().items() if s.has_fp4)
        raise ConfigError(
            f"invalid quantization={quantization or fmt.name!r} on gpu={spec.name!r}: "
            f"{fmt.name} weights need FP4 tensor cores ({fp4})"
        )
    kv_dtype_bytes(kv_cache_dtype)
    util = gpu_memory_utilization
    if util is not None and (isinstance(util, bool) or not 0.0 < util <= 1.0):
        raise ConfigError(f"invalid gpu_memory_utilization={util!r}: must be in (0, 1]")
    if enable_expert_parallel and not arch.is_moe:
        raise ConfigError("enable_expert_parallel needs a mixture-of-experts model")
    return Deployment(arch, spec, tp, pp, fmt, kv_cache_dtype.strip().lower(), util,
                      enable_expert_parallel)  # fmt: skip
