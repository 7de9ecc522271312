"""The evaluation pass a training config runs between steps, as `setup.eval_batch`.

An evaluation pass runs the model under `torch.no_grad()` (transformers 5.25.0 trainer.py
`prediction_step`; torchtune main full_finetune_distributed.py:881): it saves no activations,
but its loss still makes the batch's logits (in transformers' loss with their fp32 copies),
next to the weights and optimizer states that stay resident; estimator/memory/evaluation.py
prices it as a moment of its own. With more rows than the training micro-batch it may pass
the training step's peak (axolotl says as much: "eval_batch_size != micro_batch_size. This can
lead to VRAM instability", utils/schemas/validation.py:280-291), and with Liger's fused loss at
any rows: Liger skips the logits in training only (liger-kernel ead96b61
src/liger_kernel/transformers/model/llama.py:113-136 `skip_logits = self.training and labels
is not None` when the caller passes none; axolotl 067b021c integrations/liger/models/base.py:
84-97, the same rule), and transformers' Trainer and its subclasses (axolotl's AxolotlTrainer,
LLaMA-Factory's CustomSeq2SeqTrainer, whose SFT stage keeps the fused loss:
model/loader.py:142) pass none, so their evaluation makes the full logits.

TRL's SFTTrainer asks Liger to skip the logits in evaluation too (trl f2cd5771
sft_trainer.py:1718-1732, whenever no `compute_metrics` or `preprocess_logits_for_metrics` is
given, which a config file cannot give and the `trl sft` script does not): with Liger's loss
its batch is read with `eval_skip_logits` (the fused pass, estimator/memory/evaluation.py).
Where the pass is not modelled (`estimator.setup_rules.eval_loss_unmodelled` and
`eval_split_unmodelled`: tensor / pipeline / context / expert parallel layouts) the batch is
reported under `ignored` when it exceeds the training one, naming the key.
"""

from __future__ import annotations

from estimator.parallel.layout import parse_parallel
from estimator.setup_rules import eval_loss_unmodelled, eval_split_unmodelled
from estimator.stacks import load_stack
from estimator.train_config.result import TrainConfigMapping, whole_number


def set_eval_batch(
    m: TrainConfigMapping, value: object, key: str, skips_liger_logits: bool = False
) -> None:
    """The evaluation batch `value` (rows per device, config key `key`) as `eval_batch` where
    its pass is modelled for the setup read so far, else reported when it exceeds the training
    batch (module docstring). `skips_liger_logits`: the trainer asks Liger to skip the logits
    in evaluation (TRL's SFTTrainer). Call once the reader has set the loss and the layout."""
    rows = whole_number(value, key)
    reason = _not_modelled(m)
    if reason is None:
        m.set("eval_batch", rows, key)
        if skips_liger_logits and _loss(m) == "liger":
            m.set("eval_skip_logits", True, f"{key} (TRL's SFTTrainer: skip_logits in evaluation)")
        return
    batch = m.setup.get("batch", 1)
    train_rows = batch if isinstance(batch, int) else 1
    if rows > train_rows:
        m.ignore(
            key,
            f"evaluation runs {rows} rows per device where training runs {train_rows}; {reason}",
        )


def _loss(m: TrainConfigMapping) -> str:
    """The loss of the setup read so far (its stack's where the config sets none)."""
    stack = str(m.setup.get("stack", "hf"))
    return str(m.setup.get("loss") or load_stack(stack).get("loss"))


def _not_modelled(m: TrainConfigMapping) -> str | None:
    """Why the evaluation pass of the setup read so far is not priced, or None."""
    parallel = m.setup.get("parallel")
    split = eval_split_unmodelled(parse_parallel(str(parallel))) if parallel else None
    return eval_loss_unmodelled(_loss(m)) or split
