"""Evaluation batches larger than the training micro-batch, reported by every reader.

An evaluation pass runs the model under `torch.no_grad()` (transformers 5.25.0 trainer.py
`prediction_step`; torchtune main full_finetune_distributed.py:881): it saves no activations,
but its loss still makes the batch's logits (and, in transformers' loss, their fp32 copies),
next to the weights and optimizer states that stay resident. At no more rows than the training
micro-batch its peak is below the training step's; with more rows the logits grow with them
and may pass it (axolotl says as much: "eval_batch_size != micro_batch_size. This can lead to
VRAM instability", utils/schemas/validation.py:280-291). trainfit prices the training step, so
such a batch is reported under `ignored`, naming the key.

Liger's fused linear cross-entropy saves the logits in training only: its causal-LM forward
takes `skip_logits = self.training and labels is not None` when the caller passes none
(liger-kernel ead96b61 src/liger_kernel/transformers/model/llama.py:113-136, axolotl 067b021c
integrations/liger/models/base.py:84-97, the same rule), and in evaluation runs `lm_head` over
every position and transformers' loss (logits, their fp32 copy and the fp32 log-softmax:
`estimator.memory.logits.loss_forward_bytes_per_logit`, 10 bytes per logit in bf16). TRL's
SFTTrainer passes `skip_logits` in evaluation unless metrics want the logits (trl f2cd5771
sft_trainer.py:1718-1732); transformers' Trainer and its subclasses (axolotl's AxolotlTrainer,
LLaMA-Factory's CustomSeq2SeqTrainer, whose SFT stage keeps the fused loss: model/loader.py:142)
pass nothing, so a Liger run's evaluation makes the logits its training never does: warned,
at any evaluation batch.
"""

from __future__ import annotations

from estimator.memory.logits import loss_forward_bytes_per_logit
from estimator.train_config.result import TrainConfigMapping, whole_number

BF16_BYTES = 2  # the logits' dtype under bf16 autocast or a bf16 model


def report_eval_batch(m: TrainConfigMapping, value: object, key: str, train_rows: int) -> None:
    """Report `key` (the evaluation batch, rows per device) when it exceeds `train_rows`."""
    rows = whole_number(value, key)
    if rows > train_rows:
        m.ignore(
            key,
            f"evaluation runs {rows} rows per device where training runs {train_rows}: its "
            "no-grad forward's logits, which may outgrow the training step's peak, are not "
            "modelled",
        )


def warn_liger_evaluation(m: TrainConfigMapping, trainer: str) -> None:
    """Warn that `trainer` (transformers' Trainer or a subclass that passes no `skip_logits`)
    evaluates a Liger-loss model with its full logits (module docstring). Call when the config
    runs an evaluation."""
    if m.setup.get("loss") != "liger":
        return
    per_logit = loss_forward_bytes_per_logit(BF16_BYTES, hold_output=False)
    m.warnings.append(
        f"{m.origin.get('loss', 'liger')}: Liger skips the logits in training only; {trainer} "
        "evaluates with the full logits and transformers' loss (liger-kernel "
        "transformers/model/llama.py:113-136), rows x positions x vocab x "
        f"{per_logit} bytes per evaluation step, which the training estimate does not include"
    )
