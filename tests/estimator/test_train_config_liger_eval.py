"""Liger's fused loss skips the logits in training only: transformers' Trainer and the
subclasses axolotl and LLaMA-Factory run evaluate with the full logits and transformers' loss
(liger-kernel ead96b61 transformers/model/llama.py:113-136), TRL's SFTTrainer asks Liger to skip
them (trl f2cd5771 sft_trainer.py:1718-1732). Before, a Liger config with an evaluation set was
priced on its training step alone: at the first evaluation the run made logits the estimate
never counted."""

from __future__ import annotations

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.train_config import read_train_config_text

AXOLOTL = (
    "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 8192\nmicro_batch_size: 1\n"
    "adapter: lora\nlora_r: 16\nlora_target_linear: true\n"
    "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
)
LLAMAFACTORY = (
    "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    "cutoff_len: 8192\nper_device_train_batch_size: 1\n"
)
HF_TRAINER = "per_device_train_batch_size: 1\noutput_dir: out\n"


@pytest.mark.parametrize(
    ("text", "eval_batch"),
    [
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0.05\n", 1),
        (AXOLOTL + "liger_fused_linear_cross_entropy: true\n", None),  # no evaluation set
        (LLAMAFACTORY + "enable_liger_kernel: true\neval_strategy: steps\n", 8),  # default
        (
            LLAMAFACTORY + "enable_liger_kernel: true\neval_strategy: steps\n"
            "per_device_eval_batch_size: 1\n",
            1,
        ),
        (LLAMAFACTORY + "enable_liger_kernel: true\n", None),
        (HF_TRAINER + "use_liger_kernel: true\neval_strategy: epoch\n", 8),
        (HF_TRAINER + "use_liger_kernel: true\neval_strategy: 'no'\n", None),
    ],
)
def test_a_liger_run_that_evaluates_under_the_trainer_prices_its_pass(
    text: str, eval_batch: int | None
) -> None:
    mapping = read_train_config_text(text)
    assert mapping.setup["loss"] == "liger"
    assert mapping.setup.get("eval_batch") == eval_batch


def test_its_evaluation_sets_the_peak_where_training_makes_no_logits() -> None:
    """axolotl's Llama-3.1-8B LoRA at 8,192 tokens with Liger: training never holds the
    logits; one evaluation row holds 8,192 x 128,256 of them with transformers' fp32 copies."""
    mapping = read_train_config_text(
        AXOLOTL + "liger_fused_linear_cross_entropy: true\nval_set_size: 0.05\n"
    )
    setup = TrainingSetup(**mapping.setup)
    spec = spec_from_config(preset_config("llama-3.1-8b"))
    profile = load_profile("default")
    mem = memory_breakdown(spec, setup, 8192.0, 1, profile)
    totals = {k: float(sum(v.values())) for k, v in mem.phases.items()}
    assert max(totals, key=lambda k: totals[k]) == "evaluation"
    logits = 8192 * 128256 * (2 + 4 + 4)  # bf16 logits, their fp32 copy, the log-softmax
    assert float(mem.phases["evaluation"]["evaluation"]) >= logits
    no_eval = memory_breakdown(
        spec, setup.model_copy(update={"eval_batch": None}), 8192.0, 1, profile
    )
    assert float(mem.allocated) > float(no_eval.allocated) + 0.5 * logits
