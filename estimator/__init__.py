"""trainfit's estimator: config.json + training setup -> per-component memory, FLOPs, time,
cost and a fit verdict per GPU. Pure library: no torch, no web framework at import, and it
imports nothing from the front door (`trainfit`), the service (`app`) or the probe (`probe`).

The names below are loaded on first use, so `import estimator` stays cheap (the pydantic
request models are built only when a request is made)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from estimator.architectures import SUPPORTED_MODEL_TYPES, spec_from_config
    from estimator.errors import EstimatorInputError
    from estimator.request import CheckRequest, EstimateRequest, ModelInput
    from estimator.scenario import Scenario
    from estimator.setup import TrainingSetup
    from estimator.spec import ModelSpec, params_only_spec

_EXPORTS = {
    "SUPPORTED_MODEL_TYPES": "estimator.architectures",
    "spec_from_config": "estimator.architectures",
    "EstimatorInputError": "estimator.errors",
    "CheckRequest": "estimator.request",
    "EstimateRequest": "estimator.request",
    "ModelInput": "estimator.request",
    "Scenario": "estimator.scenario",
    "TrainingSetup": "estimator.setup",
    "ModelSpec": "estimator.spec",
    "params_only_spec": "estimator.spec",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'estimator' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CheckRequest",
    "EstimateRequest",
    "EstimatorInputError",
    "ModelInput",
    "ModelSpec",
    "Scenario",
    "TrainingSetup",
    "params_only_spec",
    "spec_from_config",
]
