"""The embedding's output kept as an autograd leaf through the step, where a frozen embedding's
output is made to require grad and the model computes the first layer's input from it.

transformers' `gradient_checkpointing_enable` calls `enable_input_require_grads` for every model
taking `input_ids` (transformers 5.25.0 modeling_utils.py:3195-3200), and so do peft and TRL
under adapters with checkpointing (peft 0.22.0 peft_model.py:780-781, utils/other.py:262-263;
trl 1.16.0 sft_trainer.py:898-900): a forward hook calls `output.requires_grad_(True)` on the
input embeddings' output (modeling_utils.py:2155-2156). With the embedding frozen (adapters) that
output has no grad_fn, so it becomes a leaf, and the AccumulateGrad node that will receive its
gradient holds the tensor itself (torch 2.13 torch/csrc/autograd/functions/accumulate_grad.h:308
`variable`) until the graph is freed after the backward. Where the first layer's input is that
output (Llama, Qwen, Gemma's scaled embedding module, ...) it is the first checkpoint, counted
already; where the model makes a new tensor of it, the leaf is one more token-wide tensor alive
all step:
- GPT-2: `inputs_embeds + position_embeds` (models/gpt2/modeling_gpt2.py:577);
- Granite: `inputs_embeds * self.embedding_multiplier` (models/granite/modeling_granite.py:388).
Measured: a fake trace of the hf stack's LoRA step on small GPT-2 (TRL SFTTrainer, 1024 tokens)
holds the `wte` output (modeling_gpt2.py:569) at the step's peak, the activations' -0.8 % before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

# model types whose first layer's input is a new tensor made from the embedding's output
# (module docstring)
TRANSFORMED_EMBEDDINGS = frozenset({"gpt2", "granite"})


def embedding_leaf_bytes(spec: ModelSpec, setup: TrainingSetup, stream: int) -> float:
    """Bytes per token of the embedding's output held as a leaf through the step (module
    docstring): adapters with the embedding frozen, layers checkpointed, on a stack that runs
    transformers' models with its `embedding_output_leaf` fact, for a model that transforms the
    embedding's output; `stream` is its bytes per value (the embedding's dtype)."""
    if not setup.is_adapter or setup.train_embeddings or setup.checkpointing == "none":
        return 0.0
    if spec.model_type not in TRANSFORMED_EMBEDDINGS:
        return 0.0
    if not load_stack(setup.stack).get_optional("embedding_output_leaf", False):
        return 0.0
    return float((spec.hidden or 0) * stream)
