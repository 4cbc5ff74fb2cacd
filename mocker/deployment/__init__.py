"""The model, GPU, parallelism and precision an engine stands for, and the KV capacity they give."""

from mocker.deployment.capacity import KVCapacity, kv_capacity
from mocker.deployment.gpus import GpuSpec, gpu_spec, known_gpus
from mocker.deployment.models import ModelArch, bundled_models, resolve_model
from mocker.deployment.precision import KV_CACHE_DTYPES, QUANTIZATIONS, WeightFormat
from mocker.deployment.spec import Deployment, deployment_from

__all__ = [
    "KV_CACHE_DTYPES",
    "QUANTIZATIONS",
    "Deployment",
    "GpuSpec",
    "KVCapacity",
    "ModelArch",
    "WeightFormat",
    "bundled_models",
    "deployment_from",
    "gpu_spec",
    "known_gpus",
    "kv_capacity",
    "resolve_model",
]
