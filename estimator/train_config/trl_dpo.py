"""TRL's DPOConfig (trl 1.16.0 trl/trainer/dpo_config.py), as a `trl dpo --config` YAML or a
`DPOConfig.to_dict()` dump: the TrainingArguments and ModelConfig keys as for SFT
(`estimator.train_config.hf_args`), and the keys only DPOConfig has.

- `objective`: `dpo`, or `dpo-precomputed` under `precompute_ref_log_probs` (:227);
- `max_length` (default 1024, :195-196): the longest prompt + completion, the estimate's length;
- the loss: DPOTrainer computes its log-probabilities through TRL's fused LM head whatever the
  `loss_type` (trl/trainer/dpo_trainer.py:959, 1299): the hf stack's `chunked`; Liger's fused
  cross-entropy is refused there (:937-953), its layer kernels stay;
- `disable_dropout` (default true, :185-188): every nn.Dropout's p set to 0
  (trl/trainer/utils.py:194-197 `disable_dropout_in_model`, called at dpo_trainer.py:931-935),
  and torch's dropout with p = 0 returns its input (no mask, no copy): LoRA dropout 0;
- `padding_free` falls back to padding since the DPO refactor (:210-218): not honoured.
The other DPO keys (`beta`, `loss_type`, `loss_weights`, the f-divergences, `ld_alpha`,
reference-model syncing) change the loss's arithmetic on per-sequence sums, not the memory.
"""

from __future__ import annotations

from typing import Any

from estimator.train_config.result import TrainConfigMapping, whole_number

# DPOConfig fields that neither SFTConfig nor TrainingArguments has (trl 1.16.0 dpo_config.py)
DPO_KEYS = (
    "beta",
    "disable_dropout",
    "discopop_tau",
    "f_alpha_divergence_coef",
    "f_divergence_type",
    "label_smoothing",
    "ld_alpha",
    "loss_weights",
    "precompute_ref_batch_size",
    "precompute_ref_log_probs",
    "ref_model_mixup_alpha",
    "ref_model_sync_steps",
    "sync_ref_model",
    "use_weighting",
)
# DPOConfig's loss types (dpo_config.py:245-253); SFTConfig's are nll, dft, chunked_nll
DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
DPO_DEFAULT_LENGTH = 1024  # dpo_config.py:195-196


def is_dpo_config(data: dict[str, Any]) -> bool:
    """A key only DPOConfig has, or a `loss_type` of DPO's (a list, or one of its names)."""
    if any(k in data for k in DPO_KEYS):
        return True
    loss_type = data.get("loss_type")
    names = loss_type if isinstance(loss_type, list) else [loss_type]
    return bool(names) and all(isinstance(n, str) and n in DPO_LOSS_TYPES for n in names)


def map_dpo_objective(m: TrainConfigMapping, data: dict[str, Any], origin: str) -> None:
    """`objective` dpo, or `dpo-precomputed` under DPOConfig's `precompute_ref_log_probs`;
    `origin` names what made the run a DPO one."""
    precompute = bool(m.get(data, "precompute_ref_log_probs"))
    objective = "dpo-precomputed" if precompute else "dpo"
    m.set("objective", objective, "precompute_ref_log_probs" if precompute else origin)


def map_dpo(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """DPOConfig's own keys (module docstring); the caller mapped the Trainer's and peft's."""
    map_dpo_objective(m, data, "DPOConfig")
    length = m.get(data, "max_length")
    key = "max_length"
    if length is None and "max_length" not in data:
        length, key = DPO_DEFAULT_LENGTH, "max_length (DPOConfig default)"
    if length is not None:
        m.seq_lens = [whole_number(length, "max_length")]
        m.origin["seq_lens"] = key
    if m.setup.get("loss") != "chunked":
        origin = "DPOConfig (TRL's fused LM head, trl 1.16.0 dpo_trainer.py:959, 1299)"
        m.set("loss", "chunked", origin)
    disable = m.get(data, "disable_dropout")
    if (disable is None or disable) and m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, "disable_dropout" + (" (default true)" * (disable is None)))
    if m.get(data, "padding_free"):
        m.ignore(
            "padding_free",
            "DPOTrainer falls back to padded batches (trl 1.16.0 dpo_config.py:210-218)",
        )
    for k in DPO_KEYS:
        m.get(data, k)
    m.get(data, "loss_type")
