"""Pass-duration models: GPU kernel data (aiconfigurator-core), a roofline where it has none,
measured profiles, Dynamo's polynomial, and corrections fitted to measurements."""

from mocker.timing.correction import CorrectedTiming, Correction, load_correction
from mocker.timing.gpu import GpuTiming
from mocker.timing.polynomial import PolynomialTiming
from mocker.timing.profile import ProfileTiming
from mocker.timing.roofline import RooflineTiming
from mocker.timing.select import describe_timing, load_timing_model
from mocker.timing.shape import PassShape, TimingModel, pass_duration_s
from mocker.timing.spec import TimingKind, TimingSpec

__all__ = [
    "CorrectedTiming",
    "Correction",
    "GpuTiming",
    "PassShape",
    "PolynomialTiming",
    "ProfileTiming",
    "RooflineTiming",
    "TimingKind",
    "TimingModel",
    "TimingSpec",
    "describe_timing",
    "load_correction",
    "load_timing_model",
    "pass_duration_s",
]
