"""Liger's fused loss skips the logits in training only: transformers' Trainer and the
subclasses axolotl and LLaMA-Factory run evaluate with the full logits and transformers' loss
(liger-kernel ead96b61 transformers/model/llama.py:113-136), TRL's SFTTrainer asks Liger to skip
them (trl f2cd5771 sft_trainer.py:1718-1732). Before, a Liger config with an evaluation set read
silently: the training estimate left out the evaluation step's logits."""

from __future__ import annotations

import pytest

from estimator.memory.logits import loss_forward_bytes_per_logit
from estimator.train_config import read_train_config_text

AXOLOTL = (
    "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 2048\nmicro_batch_size: 1\n"
    "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
)
LLAMAFACTORY = (
    "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    "cutoff_len: 2048\nper_device_train_batch_size: 1\n"
)
HF_TRAINER = "per_device_train_batch_size: 1\noutput_dir: out\n"
TRL = "model_name_or_path: meta-llama/Llama-3.1-8B\nmax_length: 2048\nuse_peft: true\n"


def liger_eval_warnings(text: str) -> list[str]:
    mapping = read_train_config_text(text)
    return [w for w in mapping.warnings if "Liger skips the logits in training only" in w]


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0.05\n", True),
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\n", False),  # no evaluation set
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0\n", False),
        (AXOLOTL + "val_set_size: 0.05\n", False),  # the Trainer's loss: full logits both ways
        (LLAMAFACTORY + "enable_liger_kernel: true\neval_strategy: steps\n", True),
        (LLAMAFACTORY + "enable_liger_kernel: true\n", False),
        (LLAMAFACTORY + "enable_liger_kernel: true\neval_strategy: steps\nstage: dpo\n", False),
        (HF_TRAINER + "use_liger_kernel: true\neval_strategy: epoch\n", True),
        (HF_TRAINER + "use_liger_kernel: true\nevaluation_strategy: steps\n", True),
        (HF_TRAINER + "use_liger_kernel: true\neval_strategy: 'no'\n", False),
        (TRL + "use_liger_kernel: true\neval_strategy: steps\n", False),  # TRL skips them
    ],
)
def test_a_liger_run_that_evaluates_under_the_trainer_is_warned(text: str, warned: bool) -> None:
    found = liger_eval_warnings(text)
    assert bool(found) is warned, found
    if warned:
        assert "transformers/model/llama.py:113-136" in found[0]


def test_the_warning_names_the_key_and_transformers_loss_bytes() -> None:
    (axolotl,) = liger_eval_warnings(
        AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0.05\n"
    )
    assert axolotl.startswith("liger_fused_linear_cross_entropy: ")
    assert "axolotl's AxolotlTrainer" in axolotl
    # bf16 logits + their fp32 copy + the fp32 log-softmax (transformers ForCausalLMLoss)
    per_logit = loss_forward_bytes_per_logit(2, hold_output=False)
    assert per_logit == 2 + 4 + 4
    assert f"x {per_logit} bytes per evaluation step" in axolotl
    (factory,) = liger_eval_warnings(
        LLAMAFACTORY + "enable_liger_kernel: true\neval_strategy: steps\n"
    )
    assert factory.startswith("enable_liger_kernel: ") and "CustomSeq2SeqTrainer" in factory


def test_the_training_estimate_is_unchanged_by_it() -> None:
    with_eval = read_train_config_text(
        AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0.05\n"
    )
    without = read_train_config_text(AXOLOTL + "liger_fused_linear_cross_entropy: true\n")
    assert with_eval.setup == without.setup
    assert with_eval.setup["loss"] == "liger"
