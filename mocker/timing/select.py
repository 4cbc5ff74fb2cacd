"""The timing model a spec names, built once per process (engines with one spec share it)."""

from __future__ import annotations

import logging

from mocker.timing.correction import CorrectedTiming, load_correction
from mocker.timing.gpu import GpuDataUnavailable, GpuTiming
from mocker.timing.polynomial import PolynomialTiming
from mocker.timing.profile import ProfileTiming
from mocker.timing.roofline import RooflineTiming
from mocker.timing.serving import SERVING
from mocker.timing.shape import TimingModel
from mocker.timing.spec import TimingKind, TimingSpec

__all__ = ["describe_timing", "load_timing_model"]

logger = logging.getLogger(__name__)

_BUILT: dict[TimingSpec, TimingModel] = {}


def load_timing_model(spec: TimingSpec) -> TimingModel:
    """The model for `spec` (the same object for equal specs). The GPU model is corrected for
    serving (`SERVING`) unless a correction profile replaces that; it falls back to a
    roofline, with a warning naming why, where aiconfigurator-core has no data."""
    model = _BUILT.get(spec)
    if model is None:
        model = _BUILT[spec] = _build(spec)
    return model


def _build(spec: TimingSpec) -> TimingModel:
    base: TimingModel
    if spec.profile is not None:
        base = ProfileTiming.from_npz(spec.profile)
    elif spec.kind is TimingKind.POLYNOMIAL:
        base = PolynomialTiming()
    else:
        assert spec.deployment is not None  # (TimingSpec checks it)
        try:
            base = GpuTiming(spec.deployment)
        except GpuDataUnavailable as exc:
            logger.warning(
                "aiconfigurator-core cannot time %s (%s): passes are timed by a roofline of "
                "the model's FLOPs and bytes over %s's published peaks instead, an estimate "
                "(calibrate it: mocker calibrate)",
                spec.deployment.model.name,
                exc,
                spec.deployment.gpu.name,
            )
            base = RooflineTiming(spec.deployment)
    if spec.correction is not None:
        return CorrectedTiming(base, load_correction(spec.correction))
    if isinstance(base, GpuTiming):
        return CorrectedTiming(base, SERVING)
    return base


def describe_timing(model: TimingModel) -> str:
    """One line: where the model's pass times come from."""
    if isinstance(model, CorrectedTiming):
        c = model.correction
        what = "for serving" if c is SERVING else "by a profile"
        return (f"{describe_timing(model.base)}, corrected {what} (decode x{c.decode_scale:.3f}, "
                f"prefill x{c.prefill_scale:.3f}, +{c.overhead_ms:.2f} ms a pass, "
                f"+{c.request_ms:.3f} ms a request)")  # fmt: skip
    if isinstance(model, GpuTiming | RooflineTiming):
        return model.source
    if isinstance(model, ProfileTiming):
        return "a measured profile (Dynamo's NPZ layout)"
    return "Dynamo mocker's polynomial (the same for every model and GPU)"
