"""Resolve a `ModelInput` (config / preset / params) into a ModelSpec.

Specs built from a preset or a config are cached by content (the preset id, or the sha256 of
the canonical JSON of the config) and shared: `ModelSpec` is frozen, and building the inventory
costs more than the rest of a one-cell estimate."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from estimator.architectures import spec_from_config
from estimator.hub import fetch_config
from estimator.presets import preset_config
from estimator.spec import ModelSpec, params_only_spec

if TYPE_CHECKING:
    from estimator.request import ModelInput

CACHE_SIZE = 256
_specs: OrderedDict[str, ModelSpec] = OrderedDict()


def _cached(key: str, build: Callable[[], ModelSpec]) -> ModelSpec:
    spec = _specs.get(key)
    if spec is None:
        spec = build()  # bad input raises here and is not cached
        _specs[key] = spec
        if len(_specs) > CACHE_SIZE:
            _specs.popitem(last=False)
    else:
        _specs.move_to_end(key)
    return spec


def config_key(config: object) -> str:
    """Content key of a config.json object: sha256 of its canonical JSON."""
    import hashlib  # here: a preset, the CLI's usual model, needs no hash (~3 ms to import)

    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def resolve_model(model: ModelInput) -> ModelSpec:
    if model.preset is not None:
        preset, name = model.preset, model.name or model.preset
        return _cached(
            f"preset\0{preset}\0{name}", lambda: spec_from_config(preset_config(preset), name=name)
        )
    if model.hub is not None:  # estimator.hub: config.json via the Hub cache / HF_ENDPOINT
        config, hub_name = fetch_config(model.hub), model.name or model.hub
        key = f"config\0{config_key(config)}\0{hub_name}"
        return _cached(key, lambda: spec_from_config(config, name=hub_name))
    if model.config is not None:
        config, config_name = model.config, model.name
        key = f"config\0{config_key(config)}\0{config_name}"
        return _cached(key, lambda: spec_from_config(config, name=config_name))
    assert model.params is not None
    return params_only_spec(
        model.params,
        name=model.name,
        hidden=model.hidden,
        layers=model.layers,
        vocab=model.vocab,
        intermediate=model.intermediate,
    )
