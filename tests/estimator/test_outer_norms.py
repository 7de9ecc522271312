"""The norm families of estimator/memory/outer_norms.py against transformers' own source: every
supported model type is placed (a new family must be decided), and each type called
LlamaRMSNorm-like runs LlamaRMSNorm's ops, each hybrid type Gemma's."""

from __future__ import annotations

import importlib
import inspect

import pytest

pytest.importorskip("transformers")

from estimator.architectures import SUPPORTED_MODEL_TYPES  # noqa: E402
from estimator.memory.activations import FP32_PRODUCT_NORMS, HYBRID_GEMMA_NORMS  # noqa: E402
from estimator.memory.outer_norms import LLAMA_RMS_NORMS  # noqa: E402

# norms of another op order, left out on purpose (outer_norms.py's LLAMA_RMS_NORMS comment)
OTHER_NORMS = frozenset(FP32_PRODUCT_NORMS | {"gemma3", "gpt2", "gpt_oss", "llama4", "llama4_text"})
MODULES = {"mistral3": "mistral"}  # the composite's language model


def _rms_norm_source(model_type: str) -> str:
    name = MODULES.get(model_type, model_type.removesuffix("_text"))
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    norms = [
        cls
        for cls_name, cls in vars(module).items()
        if inspect.isclass(cls) and cls_name.endswith("RMSNorm") and "Gated" not in cls_name
    ]
    assert norms, model_type
    return inspect.getsource(norms[0].forward)


def test_every_supported_model_type_has_a_norm_family():
    placed = LLAMA_RMS_NORMS | HYBRID_GEMMA_NORMS | OTHER_NORMS
    assert set(SUPPORTED_MODEL_TYPES) <= placed, set(SUPPORTED_MODEL_TYPES) - placed
    assert not LLAMA_RMS_NORMS & HYBRID_GEMMA_NORMS


@pytest.mark.parametrize("model_type", sorted(LLAMA_RMS_NORMS))
def test_llama_like_norms_run_llama_rms_norm_ops(model_type):
    source = _rms_norm_source(model_type)
    assert "hidden_states.to(torch.float32)" in source
    assert "return self.weight * hidden_states.to(input_dtype)" in source


@pytest.mark.parametrize("model_type", sorted(HYBRID_GEMMA_NORMS))
def test_hybrid_norms_run_gemma_ops(model_type):
    source = _rms_norm_source(model_type)
    assert "output * (1.0 + self.weight.float())" in source
    assert "output.type_as(x)" in source
