"""Deployment settings (`--model`, `--gpu`, parallelism, precision, `--timing-model`): options, the
deployment they describe, and the engine limits vLLM derives from it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mocker.config import EngineConfig
from mocker.deployment import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    Deployment,
    bundled_models,
    deployment_from,
    known_gpus,
    kv_capacity,
)
from mocker.deployment.capacity import GIB
from mocker.deployment.models import MODEL_ALIASES
from mocker.errors import ConfigError
from mocker.model_shape import ModelShape
from mocker.settings.option import Option
from mocker.timing import describe_timing, load_timing_model
from mocker.timing.spec import TimingKind

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "DEPLOYMENT_OPTIONS",
    "HARDWARE_OPTIONS",
    "arch_shape",
    "deployment_of",
    "gpu_table",
    "listing",
    "model_table",
    "scheduler_defaults",
    "startup_lines",
]

# `mocker serve` with no flags: a popular open model on the most common serving GPU.
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_GPU = "h100_sxm"

DEPLOYMENT_OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        "model: a Hugging Face id whose config is bundled (or an alias of one), or a folder "
        "holding a config.json; it sizes the KV cache and times the passes, and names the "
        "served model unless --served-model-name does ('list' prints the bundled ids; also "
        "the first positional argument of serve)",
        DEFAULT_MODEL,
        metavar="ID|PATH",
    ),
    Option(
        "gpu",
        "the GPU each rank runs on, by aiconfigurator's system names ('list' prints them with "
        "their memory and data) (mocker)",
        DEFAULT_GPU,
        metavar="SYSTEM",
    ),
    Option("tensor_parallel_size", "GPUs a layer is split across", 1, "int"),
    Option("pipeline_parallel_size", "GPUs the layers are staged across", 1, "int"),
    Option(
        "quantization",
        "weight format: " + ", ".join(QUANTIZATIONS) + " (default: the checkpoint's own)",
        None,
        metavar="METHOD",
    ),
    Option(
        "kv_cache_dtype",
        "KV cache element type: " + ", ".join(KV_CACHE_DTYPES) + " (auto: the model's)",
        "auto",
        metavar="DTYPE",
    ),
    Option(
        "gpu_memory_utilization",
        "share of each GPU's memory the engine may use, KV cache included (default: vLLM "
        "0.34's extensible KV cache, which takes all but a safety margin)",
        None,
        "float",
    ),
    Option(
        "enable_expert_parallel",
        "spread a mixture-of-experts model's experts whole over the ranks instead of "
        "splitting each one",
        False,
        "flag",
    ),
    Option(
        "timing_model",
        "gpu: pass times from aiconfigurator-core's measured kernels for --model on --gpu at "
        "its parallelism and precision (a roofline where it has none), KV capacity as vLLM "
        "computes it; polynomial: NVIDIA Dynamo mocker's model-agnostic fits and its fixed "
        "defaults (16384 blocks) (mocker)",
        TimingKind.GPU.value,
        choices=tuple(k.value for k in TimingKind),
    ),
)


# The options that describe the hardware and precision (not the model's name, not the
# timing model): what the polynomial ignores.
HARDWARE_OPTIONS = tuple(o for o in DEPLOYMENT_OPTIONS if o.dest not in ("model", "timing_model"))


def deployment_of(values: Mapping[str, Any]) -> Deployment | None:
    """The deployment the options describe; None under the polynomial (which knows none: a
    deployment flag given then is named in a warning)."""
    if values["timing_model"] != TimingKind.GPU.value:
        unused = [o.flag for o in HARDWARE_OPTIONS if values[o.dest] != o.default]
        if unused:
            logger.warning(
                "ignoring %s: --timing-model polynomial times every model and GPU alike",
                ", ".join(unused),
            )
        return None
    return deployment_from(
        values["model"],
        values["gpu"],
        tensor_parallel_size=values["tensor_parallel_size"],
        pipeline_parallel_size=values["pipeline_parallel_size"],
        quantization=values["quantization"],
        kv_cache_dtype=values["kv_cache_dtype"],
        gpu_memory_utilization=values["gpu_memory_utilization"],
        enable_expert_parallel=values["enable_expert_parallel"],
    )


def scheduler_defaults(dep: Deployment) -> tuple[int, int]:
    """vLLM 0.34's `vllm serve` defaults for (max_num_batched_tokens, max_num_seqs), which
    follow the GPU's memory (arg_utils.py, the OPENAI_API_SERVER usage context)."""
    memory = dep.gpu.memory_bytes
    if memory >= 160 * GIB:
        return 16384, 1024
    if memory >= 70 * GIB and not dep.gpu.name.startswith("a100"):
        return 8192, 1024
    return 2048, 256


def arch_shape(dep: Deployment) -> ModelShape:
    """The KV cache layout of the deployed model, from its config: every attention layer's
    K and V heads at the KV cache dtype (an MLA model's one latent per token), with its
    sliding-window layers where the config lists layer types."""
    arch = dep.model
    if arch.layout_note is not None:
        raise ConfigError(
            f"invalid model={arch.name!r}: its KV cache layout ({arch.layout_note}) is not "
            "read from its config yet: give it with --model-shape (a preset or a custom shape)"
        )
    if arch.is_mla:
        # K and V are one latent of kv_lora_rank + rope dims: one "head" of half that each.
        latent = arch.kv_lora_rank + arch.qk_rope_head_dim
        return ModelShape(num_layers=arch.num_layers, num_kv_heads=1, head_dim=-(-latent // 2),
                          dtype_bytes=dep.kv_bytes)  # fmt: skip
    layer_types = arch.layer_types if arch.sliding_window is not None else ()
    return ModelShape(
        num_layers=arch.num_layers,
        num_kv_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        dtype_bytes=dep.kv_bytes,
        layer_types=layer_types,
        sliding_window=arch.sliding_window,
    )


def startup_lines(config: EngineConfig) -> list[str]:
    """What start-up reports about the deployment: the model and GPUs, where pass times
    come from, and the KV cache as vLLM logs it."""
    timing = load_timing_model(config.timing)
    dep = config.timing.deployment
    lines = [f"timing: {describe_timing(timing)}"]
    if dep is None:
        return lines
    lines.insert(0, f"deployment: {dep.describe()}")
    layout = config.layout
    capacity = kv_capacity(
        dep,
        block_size=layout.block_size,
        block_bytes=layout.block_bytes,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_model_len=min(
            config.scheduler.max_model_len, config.cache.num_gpu_blocks * config.block_size
        ),
    )
    if capacity.num_gpu_blocks != config.cache.num_gpu_blocks:  # an override or a byte budget
        capacity = replace(capacity, num_gpu_blocks=config.cache.num_gpu_blocks)
        return [*lines, capacity.log_lines(config.scheduler.max_model_len)[-1]]
    return [*lines, *capacity.log_lines(config.scheduler.max_model_len)]


def gpu_table() -> str:
    """`--gpu list`: every GPU, its memory and whether aiconfigurator has vLLM data for it."""
    rows = [f"{'GPU':<22}{'memory':>10}  vLLM kernel data"]
    for name, spec in known_gpus().items():
        data = spec.vllm_version or "none (timed by a roofline)"
        rows.append(f"{name:<22}{spec.memory_bytes / GIB:>7.0f} GiB  {data}")
    return "\n".join(rows)


def model_table() -> str:
    """`--model list`: the bundled model ids and the aliases that name them."""
    rows = list(bundled_models())
    rows += [f"{alias} (= {target})" for alias, (target, _) in MODEL_ALIASES.items()]
    return "\n".join(sorted(rows, key=str.lower))


def listing(values: Mapping[str, Any]) -> str | None:
    """`--gpu list` or `--model list`: the table to print instead of running; else None."""
    if str(values.get("gpu", "")).strip().lower() == "list":
        return gpu_table()
    if str(values.get("model", "")).strip().lower() == "list":
        return model_table()
    return None
