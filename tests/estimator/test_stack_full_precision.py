"""The unsloth stack's full fine-tuning: Unsloth trains a bf16 model's weights in bf16 unless
`float32_mixed_precision=True` (unsloth vision.py:2172-2180, unsloth_zoo training_utils.py
prepare_model_for_training), so a full fine-tune whose precision is not given is `bf16` there
(stack fact `full_precision`), and `--precision mixed` is Unsloth's float32 mixed precision: fp32
weights under bf16 autocast (stack fact `mixed_precision: amp`). Before, both were bf16 weights
plus fp32 masters: 16 B/param of states where Unsloth's default keeps 8."""

from __future__ import annotations

import json

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from trainfit.cli import main

SPEC = spec_from_config(preset_config("llama-3.1-8b"))
PROFILE = load_profile("default")


@pytest.mark.parametrize(
    ("fields", "precision"),
    [
        ({"stack": "unsloth", "method": "full"}, "bf16"),
        ({"stack": "unsloth", "method": "full", "precision": "mixed"}, "mixed"),
        ({"stack": "unsloth", "method": "full", "precision": "fp32"}, "fp32"),
        ({"stack": "unsloth", "method": "lora"}, "mixed"),  # the adapters' business
        ({"stack": "hf", "method": "full"}, "mixed"),
        ({"stack": "torchtitan", "method": "full"}, "mixed"),
    ],
)
def test_the_precision_a_stack_gives(fields: dict[str, str], precision: str) -> None:
    setup = TrainingSetup(**fields)
    assert setup.precision == precision
    assert TrainingSetup.model_validate(setup.model_dump()) == setup  # a stored setup


def _states(**fields: str) -> tuple[float, float]:
    parts = memory_breakdown(SPEC, TrainingSetup(**fields), 2048.0, 1, PROFILE).components
    return parts["weights"], parts["trainable_states"]


def test_unsloth_s_default_keeps_bf16_weights_gradients_and_states() -> None:
    params = SPEC.params_total
    weights, states = _states(stack="unsloth", method="full")
    assert weights == pytest.approx(2 * params, rel=0.01)
    assert states == pytest.approx(6 * params, rel=0.01)  # bf16 gradients, two bf16 states


def test_unsloth_s_float32_mixed_precision_is_fp32_weights_without_masters() -> None:
    params = SPEC.params_total
    weights, states = _states(stack="unsloth", method="full", precision="mixed")
    assert weights == pytest.approx(4 * params, rel=0.01)
    assert states == pytest.approx(12 * params, rel=0.01)  # fp32 gradients and states


def test_the_cli_leaves_precision_to_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", "llama-3.1-8b", "--method", "full", "--gpu", "h200"]
    for extra, expected in (
        (["--stack", "unsloth"], "bf16"),
        (["--stack", "unsloth", "--precision", "mixed"], "mixed"),
        ([], "mixed"),
    ):
        capsys.readouterr()
        assert main([*base, *extra, "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["setup"]["precision"] == expected
