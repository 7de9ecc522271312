"""The probe's setup options mirror the estimator's TrainingSetup (without importing it)."""

from __future__ import annotations

import pytest

from memtest_schema import STACK_SETUP_FIELDS
from probe.options import (
    DEFAULT_SETUP,
    ProbeInputError,
    normalize_setup,
    parse_sweep,
)


def test_probe_defaults_and_choices_match_the_estimators_training_setup():
    setup_module = pytest.importorskip("estimator.setup")
    # the probe's own loop is the estimator's `probe` stack
    estimator_default = setup_module.TrainingSetup(stack="probe").model_dump()
    assert {k: estimator_default[k] for k in DEFAULT_SETUP} == DEFAULT_SETUP
    # the stack fields: the estimator resolves them from the stack, the probe from its own loop
    assert set(estimator_default) - set(DEFAULT_SETUP) <= set(STACK_SETUP_FIELDS)


def test_probe_package_does_not_import_the_estimator():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "probe"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("estimator", "app", "pydantic") for n in names), path


def test_normalize_fills_defaults_and_names_bad_fields():
    assert normalize_setup({"method": "lora"})["lora_targets"] == ["all-linear"]
    with pytest.raises(ProbeInputError) as info:
        normalize_setup({"precision": "fp8"})
    assert info.value.field == "setup.precision"
    with pytest.raises(ProbeInputError) as info:
        normalize_setup({"warmup": 3})
    assert info.value.field == "setup.warmup"


def test_sweep_parsing_rejects_duplicates_and_non_positive_lengths():
    assert parse_sweep("16000, 32000") == [16000, 32000]
    for bad in ("", "0", "5,5", "1.5"):
        with pytest.raises(ProbeInputError):
            parse_sweep(bad)
