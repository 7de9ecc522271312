"""The embedding's output held as an autograd leaf (estimator/memory/embedding_leaf.py): under
adapters with checkpointing, transformers' `enable_input_require_grads` makes a frozen
embedding's output a leaf that its AccumulateGrad node keeps all step; GPT-2 and Granite make
the first layer's input a new tensor of it, so it is one more token-wide tensor. The referee is
tests/probe/test_embedding_leaf_accuracy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
PROFILE = load_profile("default")
SEQ = 1024.0


def _spec(name: str) -> Any:
    return spec_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


def _checkpoints(spec: Any, **fields: Any) -> float:
    setup = TrainingSetup(method="lora", checkpointing="gpu", **fields)
    return float(memory_breakdown(spec, setup, SEQ, 1, PROFILE).components["checkpoints"])


def test_gpt2_under_adapters_holds_the_embedding_output_all_step() -> None:
    spec = _spec("small-gpt2")
    held = _checkpoints(spec) - _checkpoints(spec, train_embeddings=True)
    assert held == SEQ * spec.hidden * 2  # bf16, the embedding's dtype


@pytest.mark.parametrize(
    "name, fields",
    [
        ("small-llama", {}),  # the embedding's output is the first layer's input itself
        ("small-gemma", {}),  # scaled inside the embedding module: its output is that input
        ("small-gpt2", {"stack": "probe"}),  # the probe's own loop: no such hook
    ],
)
def test_no_leaf_where_the_first_layer_reads_the_embedding_output(
    name: str, fields: dict[str, Any]
) -> None:
    spec = _spec(name)
    assert _checkpoints(spec, **fields) == _checkpoints(spec, train_embeddings=True, **fields)


def test_no_leaf_without_checkpointing() -> None:
    spec = _spec("small-gpt2")
    setup = TrainingSetup(method="lora", checkpointing="none")
    trained = TrainingSetup(method="lora", checkpointing="none", train_embeddings=True)
    frozen = memory_breakdown(spec, setup, SEQ, 1, PROFILE).components["checkpoints"]
    assert frozen <= memory_breakdown(spec, trained, SEQ, 1, PROFILE).components["checkpoints"]
