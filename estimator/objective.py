"""What the training objective changes in a step: the sequences a micro-batch runs, a reference
model's forward and weights.

`sft`: `batch` sequences a micro-batch, one forward and backward.

`dpo` (TRL 1.16.0's DPOTrainer, the `hf` stack): `batch` is preference pairs a micro-batch
(`per_device_train_batch_size` counts dataset rows, each a prompt with a chosen and a rejected
completion). Read from the source:

- `DataCollatorForPreference.torch_call` (trl 1.16.0 trl/trainer/dpo_trainer.py:146-200) puts
  every row's prompt + chosen and prompt + rejected in one batch of 2 x batch sequences, padded
  to the longest (right padding, attention mask zeros on the padding), so the policy's forward
  and backward run 2 x batch sequences of up to `seq` tokens: `sequences_per_row` is 2, and the
  rows carry padding (`padded_batches`, resolved true unless stated).
- the policy's forward goes through the same fused LM head as SFTTrainer's loss
  (`add_fused_lm_head`, dpo_trainer.py:959; called with `fused_lm_head=True` at :1299): the
  hf stack's `chunked` loss, its 4096-position tile (estimator/memory/logits.py).
- the reference log-probabilities (:1320-1339): after the policy's forward, under
  `torch.no_grad()`, a second forward of the same 2 x batch sequences, through the policy with
  its adapters disabled when peft trains (`use_adapter(..., None)`, :1328-1336: no other
  weights), else through a reference model (:1338). That model is loaded at start
  (`create_model_from_path`, :927) in the policy's dtype (:924) and prepared like it (FSDP,
  DeepSpeed, or a plain copy, :984-990): its weights are one more copy of the policy's, stored
  and sharded as the policy's are (`reference_weights_held`). The no-grad forward saves
  nothing; its transients (one layer's, and the head's tile) are within the backward's, which
  runs afterwards on the same sequences with the policy's activations and the gradients alive,
  so it sets no moment of its own (measured with the probe's DPOTrainer referee,
  tests/probe/test_dpo_accuracy.py). Not modelled: under an fp32 residual stream (AMP full
  fine-tuning, QLoRA's kbit preparation) the reference head's forward holds its own fp32 copy
  of the labelled hidden states (trl utils.py:1645) beside the policy's saved one, which the
  referee's storage dumps show at its peak (-0.2 to -1.0 % on its 2-layer models). Its FLOPs
  are one forward (`reference_forward`).
- the labels are the completions only (:1297-1298): the fused head scores the completion
  positions, while the estimate counts every position but each sequence's first (the hf
  stack's chunked loss), an upper bound by the prompt's share of the head's tile (at most
  4096 x 32768 values), of TRL's hidden-state copy and of its per-position statistics.

`loss: full` under `dpo`: TRL 1.0-1.9's DPOTrainer (1.8.0 is axolotl 067b021c's pin,
pyproject.toml:23), the same batch of 2 x batch sequences and the same reference, but the
log-probabilities are taken from the full logits the model returns (trl v1.8.0
trainer/dpo_trainer.py:1289-1296, `selective_log_softmax`), the reference's logits likewise
(:1329-1334), and the metrics take the entropy of a copy of the policy's (:1536): the loss's
bytes are `dpo_full_logits_bytes` (estimator/memory/logits.py), measured with the probe's
trace of TRL 1.8.0's step (tests/probe/test_dpo_full_logits.py).

`dpo-precomputed` (DPOConfig `precompute_ref_log_probs=True`, dpo_config.py:227): the
reference log-probabilities are computed once before training and read from the batch
(:1317-1318); without FSDP no reference model is kept (:910-914), under FSDP the one loaded for
the precomputation is freed when it is done (:1033-1034). A step is the policy's alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

PREFERENCE = ("dpo", "dpo-precomputed")


def sequences_per_row(setup: TrainingSetup) -> int:
    """Sequences a micro-batch runs per row of `batch`: 2 for a preference pair."""
    return 2 if setup.objective in PREFERENCE else 1


def sequences(batch: Any, setup: TrainingSetup) -> Any:
    """`batch` rows as the sequences a micro-batch runs (an int stays an int, an array an
    array)."""
    k = sequences_per_row(setup)
    if k == 1:
        return batch
    if type(batch) is int:
        return batch * k
    return np.asarray(batch, dtype=np.float64) * k


def reference_forward(setup: TrainingSetup) -> bool:
    """Whether each step runs the reference model's forward (DPO without precomputation)."""
    return setup.objective == "dpo"


def losses_for(setup: TrainingSetup, losses: tuple[str, ...]) -> tuple[str, ...]:
    """The losses of `losses` a setup can run, for the grids that try losses (recommend, the
    settings table): under DPO the setup's own, which names the TRL release
    (`chunked`: 1.16's fused head; `full`: 1.0-1.9's full logits), not a setting to try."""
    return (setup.loss,) if setup.objective in PREFERENCE else losses


def splits_the_model_ok(setup: TrainingSetup) -> bool:
    """Whether tp / pp / cp / ep layouts are candidates (DPO's are not modelled)."""
    return setup.objective not in PREFERENCE


def reference_weights_held(setup: TrainingSetup) -> bool:
    """Whether a reference model's weights are held beside the policy's: DPO without
    precomputation of full fine-tuning (under peft the reference is the policy with its
    adapters disabled)."""
    return setup.objective == "dpo" and not setup.is_adapter
