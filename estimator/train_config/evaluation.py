"""Evaluation batches larger than the training micro-batch, reported by every reader.

An evaluation pass runs the model under `torch.no_grad()` (transformers 5.25.0 trainer.py
`prediction_step`; torchtune main full_finetune_distributed.py:881): it saves no activations,
but its loss still makes the batch's logits (and, in transformers' loss, their fp32 copies),
next to the weights and optimizer states that stay resident. At no more rows than the training
micro-batch its peak is below the training step's; with more rows the logits grow with them
and may pass it (axolotl says as much: "eval_batch_size != micro_batch_size. This can lead to
VRAM instability", utils/schemas/validation.py:280-291). trainfit prices the training step, so
such a batch is reported under `ignored`, naming the key.
"""

from __future__ import annotations

from estimator.train_config.result import TrainConfigMapping, whole_number


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
