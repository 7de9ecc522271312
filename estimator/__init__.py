"""trainfit's estimator: config.json + training setup -> per-component memory, FLOPs, time,
cost and a fit verdict per GPU. Pure library: no torch, no web framework at import."""

from estimator.architectures import SUPPORTED_MODEL_TYPES, spec_from_config
from estimator.errors import EstimatorInputError
from estimator.request import CheckRequest, EstimateRequest, ModelInput
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec, params_only_spec

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CheckRequest",
    "EstimateRequest",
    "EstimatorInputError",
    "ModelInput",
    "ModelSpec",
    "TrainingSetup",
    "params_only_spec",
    "spec_from_config",
]
