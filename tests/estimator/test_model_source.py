"""Specs are cached by content: the same config builds once, a changed one builds anew."""

from __future__ import annotations

import copy

import pytest

from estimator.errors import EstimatorInputError
from estimator.model_source import config_key, resolve_model
from estimator.presets import preset_config
from estimator.request import ModelInput


def test_the_same_config_is_built_once_and_an_edit_builds_a_new_spec() -> None:
    config = preset_config("llama-3.1-8b")
    first = resolve_model(ModelInput(config=config))
    reordered = dict(reversed(list(copy.deepcopy(config).items())))
    assert resolve_model(ModelInput(config=reordered)) is first
    edited = {**config, "num_hidden_layers": config["num_hidden_layers"] - 1}
    other = resolve_model(ModelInput(config=edited))
    assert other is not first and other.layers == first.layers - 1


def test_the_name_is_part_of_the_key() -> None:
    config = preset_config("llama-3.1-8b")
    a = resolve_model(ModelInput(config=config, name="a"))
    b = resolve_model(ModelInput(config=config, name="b"))
    assert (a.name, b.name) == ("a", "b")


def test_a_bad_config_is_not_cached() -> None:
    bad = {**preset_config("llama-3.1-8b"), "num_hidden_layers": -2}
    for _ in range(2):
        with pytest.raises(EstimatorInputError):
            resolve_model(ModelInput(config=bad))


def test_config_key_ignores_key_order_only() -> None:
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1})
    assert config_key({"a": 1}) != config_key({"a": 2})
