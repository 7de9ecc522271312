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
bytes are `preference_full_logits_bytes` (estimator/memory/logits.py), measured with the probe's
trace of TRL 1.8.0's step (tests/probe/test_dpo_full_logits.py).

`dpo-precomputed` (DPOConfig `precompute_ref_log_probs=True`, dpo_config.py:227): the
reference log-probabilities are computed once before training and read from the batch
(:1317-1318); without FSDP no reference model is kept (:910-914), under FSDP the one loaded for
the precomputation is freed when it is done (:1033-1034). A step is the policy's alone.

`orpo`, `cpo`, `simpo`: TRL 1.0-1.9's ORPOTrainer and CPOTrainer (trl v1.8.0
trl/experimental/orpo/orpo_trainer.py, trl/experimental/cpo/cpo_trainer.py; axolotl 067b021c runs
them for `rl: orpo` and `rl: simpo`, core/builders/rl.py:75-80, 135-145). `batch` is preference
pairs: `concatenated_inputs` (orpo_trainer.py:609-671) stacks every row's chosen and rejected
sequence in one batch of 2 x batch, padded to the longer, and the policy runs it once
(`concatenated_forward`, :748-825); no reference model exists. The loss reads the full logits the
model returns, so only `loss: full` is theirs: `get_batch_logps` (:708-746) takes
`selective_log_softmax` (trl v1.8.0 trl/trainer/utils.py:429-469) of every sequence, and a negative
log-likelihood term runs `nn.CrossEntropyLoss` on the chosen half (`cross_entropy_loss`, :782-795,
called at :803: a `.contiguous()` copy of the shifted half, whose log-softmax output cross-entropy
saves): ORPOTrainer always (`loss = policy_nll_loss - losses.mean()`, :851); CPOTrainer when
`cpo_alpha` is not 0 (cpo_trainer.py:841-844, 889; CPOConfig's default 1.0, cpo_config.py:133-136):
`cpo`. `simpo`: CPOTrainer with `cpo_alpha` 0, SimPO as TRL's docs set it
(docs/source/cpo_trainer.md:83, 106; `loss_type="alphapo"` too), no such term. The loss's bytes are
`preference_full_logits_bytes` (estimator/memory/logits.py), measured with the probe's trace of TRL
1.8.0's own steps (tests/probe/test_orpo_full_logits.py). From TRL 1.10 `selective_log_softmax`
runs a Triton kernel on CUDA (trl 1.16.0 trainer/utils.py:572-574), which is not modelled: under
those releases the estimate is an upper bound.

`kto`: TRL 1.0-1.9's KTOTrainer (trl v1.8.0 trl/trainer/kto_trainer.py; axolotl 067b021c runs it
for `rl: kto`, core/builders/rl.py:77-78, 149-159). `batch` is unpaired rows, each a prompt with
one completion labelled desirable or undesirable, padded to the longest
(DataCollatorForUnpairedPreference, :165-210); KTOConfig's default loss_type kto estimates a KL
term from "KL rows", each prompt with another row's completion (:1112-1117, `_get_kl_dataset`
:980), and needs micro-batches of at least two rows (:785-788). A step runs, under no_grad, the
policy's forward of the KL rows (:1289-1320), then the policy's forward and backward of the rows,
then the reference's forwards of the KL rows and of the rows (:1524-1535; the policy with its
adapters disabled, or its "ref" copy of them, under peft; else a reference model loaded and
prepared as DPO's, :891-934): `no_grad_forwards`. The loss reads the full logits (`loss: full`):
`selective_log_softmax` of the rows, the reference's logits held to the loss's end, an
`index_select` of the desirable and of the undesirable rows' logits (:1513-1514, copies, kept for
the metrics) and the entropy metric's copy (:1588): `preference_full_logits_bytes`, measured on the
CPU with TRL 1.8.0's own step (tests/probe/test_kto_full_logits.py). `precompute_ref_log_probs` is
not modelled (priced with the reference forwards, an overestimate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

PREFERENCE = ("dpo", "dpo-precomputed", "kto", "orpo", "cpo", "simpo")
# the preference objectives whose trainers read only the full logits (TRL 1.0-1.9)
FULL_LOGITS_ONLY = ("kto", "orpo", "cpo", "simpo")
# the TRL trainer each preference objective prices
TRAINERS = {
    "dpo": "DPOTrainer",
    "dpo-precomputed": "DPOTrainer",
    "kto": "KTOTrainer",
    "orpo": "ORPOTrainer",
    "cpo": "CPOTrainer",
    "simpo": "CPOTrainer",
}
# the objectives whose row is a pair of sequences, a chosen and a rejected one
PAIRED = ("dpo", "dpo-precomputed", "orpo", "cpo", "simpo")


def batch_unit(objective: str) -> str:
    """What one row of `batch` is under `objective`, for the summaries ("" under SFT)."""
    if objective in PAIRED:
        return "preference pairs"
    return "labelled completions" if objective == "kto" else ""


def sequences_per_row(setup: TrainingSetup) -> int:
    """Sequences a micro-batch runs per row of `batch`: 2 for a preference pair."""
    return 2 if setup.objective in PAIRED else 1


def smallest_batch(objective: str) -> int:
    """The smallest micro-batch the objective's trainer accepts: 2 under KTO, whose KL term
    pairs each row with another's completion (trl v1.8.0 trainer/kto_trainer.py:785-789 raises
    below that), else 1."""
    return 2 if objective == "kto" else 1


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
    """Whether each step runs the reference model's forward (DPO without precomputation,
    KTO)."""
    return setup.objective in ("dpo", "kto")


def no_grad_forwards(setup: TrainingSetup) -> tuple[int, int]:
    """The forwards of the step's sequences a step runs under no_grad beside the policy's:
    (through the reference: the policy with its adapters disabled under peft, else the
    reference model; through the policy, adapters included). DPO: the reference's (1, 0).
    KTO (loss_type kto, KTOConfig's default): the reference's of the completions and of the
    KL rows, and the policy's of the KL rows (2, 1) (trl v1.8.0 trainer/kto_trainer.py
    :1289-1320 `_compute_kl_logps`, :1525-1535)."""
    if setup.objective == "kto":
        return 2, 1
    return (1, 0) if setup.objective == "dpo" else (0, 0)


def losses_for(setup: TrainingSetup, losses: tuple[str, ...]) -> tuple[str, ...]:
    """The losses of `losses` a setup can run, for the grids that try losses (recommend, the
    settings table): under a preference objective the setup's own, which names the TRL release
    (`chunked`: 1.16's fused head; `full`: 1.0-1.9's full logits), not a setting to try."""
    return (setup.loss,) if setup.objective in PREFERENCE else losses


def splits_the_model_ok(setup: TrainingSetup) -> bool:
    """Whether tp / pp / cp / ep layouts are candidates (the preference trainers' are not
    modelled)."""
    return setup.objective not in PREFERENCE


def chosen_nll(setup: TrainingSetup) -> bool:
    """Whether the loss adds the chosen half's cross-entropy over the full logits (ORPOTrainer;
    CPOTrainer with `cpo_alpha` not 0)."""
    return setup.objective in ("orpo", "cpo")


def reference_weights_held(setup: TrainingSetup) -> bool:
    """Whether a reference model's weights are held beside the policy's: DPO without
    precomputation and KTO, of full fine-tuning (under peft the reference is the policy with
    its adapters disabled; KTO loads it as DPO does, trl v1.8.0 kto_trainer.py:891-934)."""
    return setup.objective in ("dpo", "kto") and not setup.is_adapter
