"""Resolve a `ModelInput` (config / preset / params) into a ModelSpec."""

from __future__ import annotations

from estimator.architectures import spec_from_config
from estimator.presets import preset_config
from estimator.request import ModelInput
from estimator.spec import ModelSpec, params_only_spec


def resolve_model(model: ModelInput) -> ModelSpec:
    if model.preset is not None:
        return spec_from_config(preset_config(model.preset), name=model.name or model.preset)
    if model.config is not None:
        return spec_from_config(model.config, name=model.name)
    assert model.params is not None
    return params_only_spec(
        model.params,
        name=model.name,
        hidden=model.hidden,
        layers=model.layers,
        vocab=model.vocab,
        intermediate=model.intermediate,
    )
