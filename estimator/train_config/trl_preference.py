"""TRL 1.0-1.9's KTOConfig, CPOConfig and ORPOConfig (trl v1.8.0 trl/trainer/kto_config.py,
trl/experimental/cpo/cpo_config.py, trl/experimental/orpo/orpo_config.py), as a YAML of their
scripts or a `to_dict()` dump: the TrainingArguments and peft keys as for SFT
(`estimator.train_config.hf_args`), and the keys that say which trainer reads them.

- which: KTOConfig alone has `desirable_weight` and `undesirable_weight`; CPOConfig alone
  `cpo_alpha` and `simpo_gamma`; ORPOConfig and CPOConfig, unlike the other configs,
  `generate_during_eval` and `is_encoder_decoder` (their `max_completion_length` GRPOConfig has
  too, and `train_sampling_strategy` is transformers 5's TrainingArguments', so neither tells).
  A file with none of them and DPOConfig's keys is DPO's (trl_dpo.py).
- `objective` (estimator/objective.py): `kto`; `cpo`, or `simpo` where `cpo_alpha` is 0 or
  `loss_type` is alphapo (cpo_config.py:133-136, 176-180: alphapo sets cpo_alpha 0); `orpo`.
- `max_length` (default 1024 in all three): the estimate's length.
- the loss: all three read the full logits (`loss full`); `use_liger_kernel` swaps KTOTrainer's
  loss for Liger's fused KTO loss (kto_trainer.py:790-791, 955-957), not modelled (reported;
  priced with the full logits, an overestimate), its layer kernels stay.
- `disable_dropout` (default true in all three): LoRA dropout 0.
- KTO's `precompute_ref_log_probs` and loss_type `apo_zero_unpaired` (no KL term) are reported
  and priced with the reference's and the KL forwards, an overestimate.
"""

from __future__ import annotations

from typing import Any

from estimator.objective import TRAINERS
from estimator.train_config.result import TrainConfigMapping, whole_number

KTO_KEYS = ("desirable_weight", "undesirable_weight")
CPO_KEYS = ("cpo_alpha", "simpo_gamma")
ORPO_KEYS = ("generate_during_eval", "is_encoder_decoder")
DEFAULT_LENGTH = 1024  # kto_config.py:163-164, orpo_config.py:80-81, cpo_config.py:100-101


def preference_trainer(data: dict[str, Any]) -> str | None:
    """`kto`, `cpo` or `orpo` where a key only that config has is present, else None."""
    if any(k in data for k in KTO_KEYS):
        return "kto"
    if any(k in data for k in CPO_KEYS):
        return "cpo"
    if any(k in data for k in ORPO_KEYS):
        return "orpo"
    return None


def _config_name(trainer: str) -> str:
    """`KTOConfig`, `CPOConfig` or `ORPOConfig`: the config of the objective's trainer."""
    return TRAINERS[trainer].removesuffix("Trainer") + "Config"


def _objective(m: TrainConfigMapping, data: dict[str, Any], trainer: str) -> None:
    config = _config_name(trainer)
    if trainer != "cpo":
        m.set("objective", trainer, config)
        return
    alpha = m.get(data, "cpo_alpha")
    loss_type = m.get(data, "loss_type")
    if loss_type == "alphapo" or (alpha is not None and float(alpha) == 0.0):
        key = "loss_type alphapo" if loss_type == "alphapo" else "cpo_alpha 0"
        m.set("objective", "simpo", f"CPOConfig ({key}: no NLL term)")
    else:
        m.set("objective", "cpo", "CPOConfig (cpo_alpha" + " default 1.0" * (alpha is None) + ")")


def map_preference(m: TrainConfigMapping, data: dict[str, Any], trainer: str) -> None:
    """The config's own keys (module docstring); the caller mapped the Trainer's and peft's."""
    _objective(m, data, trainer)
    name = TRAINERS[trainer]
    length = m.get(data, "max_length")
    key = "max_length"
    if length is None and "max_length" not in data:
        length, key = DEFAULT_LENGTH, f"max_length ({_config_name(trainer)} default)"
    if length is not None:
        m.seq_lens = [whole_number(length, "max_length")]
        m.origin["seq_lens"] = key
    if m.setup.get("loss") == "liger":
        m.ignore(
            "use_liger_kernel",
            f"Liger's fused {name.removesuffix('Trainer')} loss is not modelled: priced with the "
            "full logits, an overestimate (Liger's layer kernels are kept)",
        )
    m.set("loss", "full", f"{name} (TRL 1.0-1.9: the full logits)")
    disable = m.get(data, "disable_dropout")
    if (disable is None or disable) and m.setup.get("method") in ("lora", "qlora"):
        m.set("lora_dropout", 0.0, "disable_dropout" + (" (default true)" * (disable is None)))
    if trainer == "kto":
        if m.get(data, "precompute_ref_log_probs"):
            m.ignore(
                "precompute_ref_log_probs",
                "not modelled for KTO: priced with the reference's forwards, an overestimate",
            )
        if m.get(data, "loss_type") == "apo_zero_unpaired":
            m.ignore(
                "loss_type",
                "apo_zero_unpaired runs no KL term (kto_trainer.py:756): priced with KTO's KL "
                "forwards, an overestimate",
            )
    for k in (*KTO_KEYS, *CPO_KEYS, *ORPO_KEYS, "beta", "label_smoothing", "alpha"):
        m.get(data, k)  # the loss's arithmetic, the evaluation's generation: no memory
    for k in ("max_completion_length", "train_sampling_strategy"):
        m.get(data, k)  # truncation within max_length, the sampler's order: no memory
    for k in ("padding_value", "pad_to_multiple_of", "loss_type", "precompute_ref_batch_size"):
        m.get(data, k)
    for k in ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps"):
        m.get(data, k)
