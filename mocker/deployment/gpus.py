"""GPUs by AIConfigurator's system names: memory, bandwidth and peak FLOPs from its system files."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from mocker.errors import ConfigError

__all__ = ["GpuSpec", "gpu_spec", "known_gpus", "systems_root", "vllm_data_version"]

# The system files' FLOPs keys by the compute type they rate.
_FLOPS_KEYS = {"bfloat16": "bfloat16_tc_flops", "fp8": "fp8_tc_flops", "fp4": "fp4_tc_flops",
               "int8": "int8_tc_flops"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU as the system file rates it (dense peaks, not sparse ones)."""

    name: str
    memory_bytes: int
    mem_bw: float  # bytes per second
    flops: tuple[tuple[str, float], ...]  # (compute type, FLOP/s)
    sm_version: int
    link_bw: float  # bytes per second per GPU, one direction, within a node
    gpus_per_node: int
    # The vLLM release whose kernels AIConfigurator measured on it (None: none measured).
    vllm_version: str | None

    def flop_rate(self, compute: str) -> float:
        """Peak FLOP/s of one compute type (bfloat16, fp8, fp4, int8); 0 where it has none."""
        return dict(self.flops).get(compute, 0.0)

    @property
    def has_fp4(self) -> bool:
        return self.flop_rate("fp4") > 0


def systems_root() -> Path:
    """Where aiconfigurator-core keeps its system files and measured kernel data."""
    return Path(str(resources.files("aiconfigurator_core") / "systems"))


def vllm_data_version(root: Path, name: str) -> str | None:
    """The newest vLLM release with measured GEMMs for this system, if any."""
    folder = root / "data" / name / "gemm" / "vllm"
    if not folder.is_dir():
        return None
    versions = sorted((p.name for p in folder.iterdir() if p.is_dir()), key=_version_key)
    return versions[-1] if versions else None


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in text.split("."))


def _spec(name: str, raw: dict[str, Any], root: Path) -> GpuSpec:
    gpu, node = raw["gpu"], raw.get("node", {})
    flops = tuple((kind, float(gpu[key])) for kind, key in _FLOPS_KEYS.items() if gpu.get(key))
    return GpuSpec(
        name=name,
        memory_bytes=int(gpu["mem_capacity"]),
        mem_bw=float(gpu["mem_bw"]),
        flops=flops,
        sm_version=int(gpu.get("sm_version", 0)),
        link_bw=float(node.get("intra_node_bw", 0.0)),
        gpus_per_node=int(node.get("num_gpus_per_node", 8)),
        vllm_version=vllm_data_version(root, name),
    )


@cache
def known_gpus() -> MappingProxyType[str, GpuSpec]:
    """Every GPU a system file describes, by name (sorted)."""
    root = systems_root()
    found: dict[str, GpuSpec] = {}
    for path in sorted(root.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if (
            isinstance(raw, dict)
            and isinstance(raw.get("gpu"), dict)
            and "mem_capacity" in raw["gpu"]
        ):
            found[path.stem] = _spec(path.stem, raw, root)
    return MappingProxyType(found)


def gpu_spec(name: str) -> GpuSpec:
    """The GPU of this name; a ConfigError naming --gpu and the choices otherwise."""
    gpus = known_gpus()
    spec = gpus.get(name.strip().lower())
    if spec is None:
        raise ConfigError(f"invalid gpu={name!r}: must be one of {', '.join(gpus)}")
    return spec
