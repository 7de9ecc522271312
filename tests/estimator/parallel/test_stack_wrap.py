"""A stack's default FSDP2 units (`fsdp_wrap` stack entry): torchtitan wraps `tok_embeddings`
and `[norm, lm_head]` as units of their own (0.3.0 distributed/fsdp.py:194-207); its Dec-2024
release (9dec370) left them in the root. The user's `fsdp_wrap` wins."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.memory import memory_breakdown
from estimator.parallel.layout import parse_wrap_units
from estimator.parallel.split import param_groups
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup

LLAMA8B = spec_from_config(preset_config("llama-3.1-8b"))
DEFAULT = load_profile("default")


def _mem(gpus: int = 8, **setup):
    s = TrainingSetup(num_gpus=gpus, method="full", parallel=f"fsdp={gpus}", **setup)
    return s, memory_breakdown(LLAMA8B, s, [4096], 1, DEFAULT, devices=gpus)


def test_torchtitan_stacks_default_to_the_units_their_release_wraps() -> None:
    assert TrainingSetup(stack="torchtitan").fsdp_wrap == "layer+embeddings+norm_lm_head"
    assert TrainingSetup(stack="torchtitan-2024").fsdp_wrap == "layer"
    assert TrainingSetup(stack="hf").fsdp_wrap == "layer"
    given = TrainingSetup(stack="torchtitan", fsdp_wrap="layer")
    assert given.fsdp_wrap == "layer"


def test_norm_lm_head_is_one_name_of_the_head() -> None:
    assert parse_wrap_units("layer+norm_lm_head+tok_embeddings") == (
        1,
        ("embeddings", "norm_lm_head"),
    )
    with pytest.raises(EstimatorInputError) as info:
        parse_wrap_units("layer+lm_head+norm_lm_head")
    assert info.value.field == "setup.fsdp_wrap"


def test_torchtitan_reduces_only_the_embedding_at_the_end_of_backward() -> None:
    """With the root unit, the end of the backward holds the embedding and lm_head unsharded
    with their gradients and reduce buffers; torchtitan's units leave only the embedding's
    backward there (the head's gradient was reduced by its own post-backward)."""
    embed, head, _, _ = param_groups(LLAMA8B)
    _, titan = _mem(stack="torchtitan")
    _, root = _mem(stack="torchtitan", fsdp_wrap="layer")
    end_titan = float(sum(titan.phases["end_of_backward"].values())[0])
    end_root = float(sum(root.phases["end_of_backward"].values())[0])
    # bf16 weights + bf16 grads + fp32 reduce input + 1/8 output of the head leave the end
    assert end_root - end_titan >= head * (2 + 2 + 4) * 0.99
    assert titan.parallel["fsdp_root_grads_unsharded"] == pytest.approx(0.0, abs=1.0)
    assert titan.parallel["fsdp_separate_units_unsharded"] == pytest.approx((embed + head) * 2)


def test_torchtitans_head_unit_stays_unsharded_after_forward() -> None:
    """`reshard_after_forward=policy == "always"` on [norm, lm_head]: under the default policy
    the head is not regathered for its backward, unlike torchtune's `+lm_head` unit, which
    follows the layers' reshard_after_forward."""
    _, head, _, _ = param_groups(LLAMA8B)
    _, kept = _mem(stack="torchtitan", fsdp_wrap="layer+norm_lm_head")
    _, resharded = _mem(stack="torchtitan", fsdp_wrap="layer+lm_head")
    layer = (LLAMA8B.params_total - param_groups(LLAMA8B)[0] - head) / LLAMA8B.layers
    # the head stays gathered from its forward (forward_extra `kept`); at the loss only the
    # last layer is prefetched beside it
    assert kept.parallel["fsdp_gathered_at_loss"] == pytest.approx(layer * 2)
    assert resharded.parallel["fsdp_gathered_at_loss"] == pytest.approx((head + layer) * 2)


def test_torchtitan_keeps_a_tied_embedding_unsharded_after_forward() -> None:
    """Tied weights: torchtitan shards [tok_embeddings, norm, lm_head] as one unit with
    `reshard_after_forward=policy == "always"` (0.3.0 distributed/fsdp.py:180-192), so the
    embedding stays gathered from the forward through the loss; `+embeddings` alone (torchtune)
    reshards it with the layers."""
    gpt2 = spec_from_config(preset_config("gpt2"))
    assert gpt2.tied_embeddings
    embed, head, _, _ = param_groups(gpt2)
    assert head == 0.0

    def loss_phase(wrap: str | None) -> float:
        extra = {} if wrap is None else {"fsdp_wrap": wrap}
        s = TrainingSetup(num_gpus=4, method="full", parallel="fsdp=4", stack="torchtitan", **extra)
        mem = memory_breakdown(gpt2, s, [1024], 1, DEFAULT, devices=4)
        return float(sum(mem.phases["loss"].values())[0])

    kept, resharded = loss_phase(None), loss_phase("layer+embeddings+lm_head")
    assert kept - resharded == pytest.approx(embed * 2, rel=1e-6)
