"""The model's last RMSNorm saves, per token, what `head_input_saved` counts for it: checked
against transformers' own LlamaRMSNorm with torch's saved-tensor hooks (every tensor autograd
keeps, by storage). Under AMP full fine-tuning the residual stream is fp32, so the norm's
`hidden_states.to(input_dtype)` returns its fp32 normalised tensor, which `weight * ...` saves
(modeling_llama.py:66-67): counted in bf16 before, 2 B x hidden per token short (a dump of
TRL's SFT step on small-llama at 1024 tokens: -0.86 % -> -0.43 %)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from estimator.architectures import spec_from_config  # noqa: E402
from estimator.memory.activations import head_input_saved  # noqa: E402
from estimator.memory.model import _fixed_of  # noqa: E402
from estimator.presets import preset_config  # noqa: E402
from estimator.profile import load_profile  # noqa: E402
from estimator.setup import TrainingSetup  # noqa: E402

HIDDEN, TOKENS = 256, 512


def _saved_bytes_per_token(stream: torch.dtype, weight: torch.dtype, trains: bool) -> float:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(HIDDEN).to(weight)
    norm.weight.requires_grad_(trains)
    x = torch.randn(1, TOKENS, HIDDEN, dtype=stream, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() != norm.weight.data_ptr():  # the weight is not an activation
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        norm(x)
    return sum(kept.values()) / TOKENS


@pytest.mark.parametrize(
    "fields, stream, weight",
    [
        ({"method": "full"}, torch.float32, torch.float32),  # AMP: fp32 weights and stream
        (
            {"method": "full", "precision": "bf16", "autocast": False},
            torch.bfloat16,
            torch.bfloat16,
        ),
        ({"method": "lora"}, torch.bfloat16, torch.bfloat16),
    ],
    ids=["amp-full", "bf16-full", "lora"],
)
def test_the_last_norm_saves_what_is_counted(fields: dict, stream: object, weight: object) -> None:
    spec = spec_from_config(preset_config("llama-3.2-1b"))
    setup = TrainingSetup(stack="hf", loss="full", **fields)
    ctx = _fixed_of(spec, setup, load_profile("default"), 1).ctx
    assert ctx is not None
    counted = head_input_saved(ctx, spec, "liger") * HIDDEN / spec.hidden  # the norm alone
    measured = _saved_bytes_per_token(stream, weight, setup.method == "full")
    assert counted == pytest.approx(measured, rel=0.01), (counted, measured)
