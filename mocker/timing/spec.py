"""Which timing model an engine uses: part of its config (`load_timing_model` builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from mocker.deployment.spec import Deployment
from mocker.errors import ConfigError

__all__ = ["TimingKind", "TimingSpec"]


class TimingKind(StrEnum):
    """`--timing-model`: from the deployment's GPU data, or Dynamo's model-agnostic fits."""

    GPU = "gpu"
    POLYNOMIAL = "polynomial"


@dataclass(frozen=True, slots=True)
class TimingSpec:
    """The model, and what changes it: a measured NPZ profile in Dynamo's layout replaces it;
    a correction profile (JSON, from `mocker calibrate`) corrects it."""

    kind: TimingKind = TimingKind.POLYNOMIAL
    deployment: Deployment | None = None  # what the GPU model times (required for gpu)
    profile: str | None = None
    correction: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", TimingKind(self.kind))
        except ValueError:
            raise ConfigError(
                f"invalid timing_model={self.kind!r}: must be one of "
                + ", ".join(k.value for k in TimingKind)
            ) from None
        if self.kind is TimingKind.GPU and self.deployment is None:
            raise ConfigError("timing_model gpu needs a deployment (--model and --gpu)")
        for name in ("profile", "correction"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"invalid timing_profile={path!r}: no such file")

    @classmethod
    def with_profile(cls, kind: TimingKind | str, deployment: Deployment | None,
                     path: str | None) -> TimingSpec:  # fmt: skip
        """`--timing-profile FILE`: a .npz measured profile or a .json correction profile."""
        try:
            model = TimingKind(kind)
        except ValueError:
            raise ConfigError(
                f"invalid timing_model={kind!r}: must be one of "
                + ", ".join(k.value for k in TimingKind)
            ) from None
        if path is None:
            return cls(model, deployment)
        suffix = Path(path).suffix.lower()
        if suffix == ".npz":
            return cls(model, deployment, profile=path)
        if suffix == ".json":
            return cls(model, deployment, correction=path)
        raise ConfigError(
            f"invalid timing_profile={path!r}: a measured profile (.npz, Dynamo's layout) or a "
            "correction profile (.json, from mocker calibrate)"
        )
