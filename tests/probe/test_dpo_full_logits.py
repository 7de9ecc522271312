"""`objective: dpo` with `loss: full` against TRL 1.8.0's own DPOTrainer step (fake trace).

TRL 1.0-1.9's DPOTrainer (1.8.0 is axolotl 067b021c's pin) computes the log-probabilities from the
full logits (trl v1.8.0 trainer/dpo_trainer.py:1289-1296, `selective_log_softmax`), where 1.16's
runs its fused head (tests/probe/test_dpo_accuracy.py). `.venv` holds TRL 1.16, so the probe runs
here in a subprocess with TRL 1.8.0's files (scripts/setup.sh installs them in `.trl-1.8`) first
on its path. The estimator prices the step with `preference_full_logits_bytes`
(estimator/memory/logits.py): four fp32 logits-sized tensors in the loss's backward under
autocast (accelerate returns fp32 logits), the forward's four bf16 ones without it.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from estimator.document import compare_memtest  # noqa: E402
from tests.probe.trl_1_8 import (  # noqa: E402
    BF16,
    LORA,
    VOCAB,
    Run,
    compared_rows,
    needs_trl_1_8,
    probe_runs,
)

RUNS = {
    "autocast": Run("dpo", (*LORA, "--batch", "2"), "1024,3000"),
    "bf16-lora": Run("dpo", (*LORA, *BF16), "1024"),
    "bf16-full": Run("dpo", ("--method", "full", *BF16), "1024"),
    "gemma2": Run("dpo", (*LORA, "--attention", "eager"), "512", "small-gemma2", 4096),
}

pytestmark = needs_trl_1_8


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The memtests of TRL 1.8.0's DPOTrainer steps, one interpreter for all."""
    out = probe_runs(tmp_path_factory.mktemp("dpo-full"), RUNS)
    for doc in out.values():
        assert any("TRL 1.8.0 DPOTrainer" in line for line in doc["environment"]["ran"])
    return out


def test_autocast_holds_four_fp32_logits_in_the_loss_backward(docs: dict[str, Any]) -> None:
    """LoRA under autocast (accelerate's fp32 logits): the saved logits, the stacked
    log-sum-exp gradients, and gather's zeros and scatter_add, each fp32 and logits-sized."""
    doc = docs["autocast"]
    for res, row in zip(doc["results"], compared_rows(doc), strict=True):
        assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
        sequences = 2 * 2  # two preference pairs, each a chosen and a rejected sequence
        logits = sequences * res["seq_len"] * VOCAB * 4
        shifted = sequences * (res["seq_len"] - 1) * VOCAB * 4
        assert res["component_maxima"]["logits"] == logits + 3 * shifted
        assert row["estimated_loss_logits"] == 4 * logits  # every position: an upper bound
        # the same step priced as SFT of one sequence a row (what axolotl's rl: read before)
        as_sft = {**doc, "setup": {**doc["setup"], "objective": "sft"}}
        sft = next(r for r in compare_memtest(as_sft, "default")["rows"] if r is not None)
        assert sft["error_pct"] < -40.0, sft["error_pct"]


@pytest.mark.parametrize("method", ["lora", "full"])
def test_bf16_logits_peak_in_the_forward(docs: dict[str, Any], method: str) -> None:
    """Without autocast the logits stay bf16: the forward's policy logits, their saved
    log-softmax, the reference's logits and the entropy metric's copy set the peak; a full
    fine-tune also holds the reference model's weights."""
    row = compared_rows(docs[f"bf16-{method}"])[0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    assert row["estimated_loss_logits"] > 4 * 2 * 1023 * VOCAB * 2


def test_softcapped_logits_keep_the_policy_s_tanh(docs: dict[str, Any]) -> None:
    """Gemma 2 softcaps its logits in the model's forward (`final_logit_softcap`): the tanh's
    saved bf16 output stays through the loss backward beside the four fp32 tensors (-9.7 %
    without it)."""
    row = compared_rows(docs["gemma2"])[0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    positions = 2 * 512
    assert row["estimated_loss_logits"] == positions * 4096 * (4 * 4 + 2)
