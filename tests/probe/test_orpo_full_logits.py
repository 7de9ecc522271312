"""`objective: orpo|cpo|simpo` against TRL 1.8.0's own ORPOTrainer and CPOTrainer steps (fake
trace, TRL 1.8.0 first on the path: tests/probe/trl_1_8.py).

Both trainers run each pair's chosen and rejected sequences in one batch and read the full
logits (trl v1.8.0 trl/experimental/orpo/orpo_trainer.py:748-823, cpo/cpo_trainer.py:791-862);
ORPO, and CPO unless cpo_alpha is 0, add a cross-entropy over the chosen half. The estimator
prices the loss with `preference_full_logits_bytes` (estimator/memory/logits.py): under autocast
the four fp32 logits-sized tensors of the log-probabilities' backward plus the chosen half's
saved log-softmax (18 bytes per logit; 16 without that term), without autocast the forward's
logits, the rows' saved log-softmax outputs and the chosen half's (5 bytes per logit).
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

TRAINER = {"orpo": "ORPOTrainer", "cpo": "CPOTrainer", "simpo": "CPOTrainer"}
RUNS = {
    "orpo": Run("orpo", (*LORA, "--batch", "2"), "1024,2048"),
    "cpo": Run("cpo", (*LORA, "--batch", "2"), "1024"),
    "simpo": Run("simpo", (*LORA, "--batch", "2"), "1024"),
    "simpo-bf16-full": Run("simpo", ("--method", "full", *BF16), "1024"),
    "orpo-bf16": Run("orpo", (*LORA, *BF16), "1024"),
    "orpo-gemma2": Run("orpo", (*LORA, "--attention", "eager"), "512", "small-gemma2", 4096),
}

pytestmark = needs_trl_1_8


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The memtests of TRL 1.8.0's ORPOTrainer and CPOTrainer steps, one interpreter for all."""
    out = probe_runs(tmp_path_factory.mktemp("orpo-full"), RUNS)
    for key, doc in out.items():
        ran = doc["environment"]["ran"][0]
        assert ran.startswith(f"TRL 1.8.0 {TRAINER[RUNS[key].objective]}.train()"), ran
    return out


def _logits(res: dict[str, Any], sequences: int, shifted: bool, vocab: int = VOCAB) -> int:
    """The logits of `sequences` sequences (each row's last position dropped where
    `shifted`), in values."""
    return sequences * (res["seq_len"] - int(shifted)) * vocab


@pytest.mark.parametrize("objective", ["orpo", "cpo"])
def test_the_chosen_half_s_log_softmax_stays_through_the_backward(
    docs: dict[str, Any], objective: str
) -> None:
    """LoRA under autocast: the log-probabilities' backward holds the fp32 logits, the stacked
    log-sum-exp gradients and gather's zeros and scatter_add (DPO's four), beside the
    chosen half's saved log-softmax, which cross-entropy made in the forward."""
    doc = docs[objective]
    for res, row in zip(doc["results"], compared_rows(doc), strict=True):
        assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
        full, shifted = 4 * _logits(res, 4, False), 4 * _logits(res, 4, True)
        half = 4 * _logits(res, 2, True)
        assert res["component_maxima"]["logits"] == full + 3 * shifted + half
        assert row["estimated_loss_logits"] == 4.5 * full  # every position: an upper bound
        # the same step priced as SFT of one sequence a row (what axolotl's rl: read before)
        as_sft = {**doc, "setup": {**doc["setup"], "objective": "sft"}}
        sft = next(r for r in compare_memtest(as_sft, "default")["rows"] if r is not None)
        assert sft["error_pct"] < -40.0, sft["error_pct"]


def test_simpo_without_the_nll_term_holds_dpo_s_four(docs: dict[str, Any]) -> None:
    """CPOTrainer with cpo_alpha 0 runs no cross-entropy: the four fp32 tensors alone."""
    res, row = docs["simpo"]["results"][0], compared_rows(docs["simpo"])[0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    full, shifted = 4 * _logits(res, 4, False), 4 * _logits(res, 4, True)
    assert res["component_maxima"]["logits"] == full + 3 * shifted
    assert row["estimated_loss_logits"] == 4 * full


def test_bf16_logits_peak_in_the_forward(docs: dict[str, Any]) -> None:
    """Without autocast (bf16 full fine-tuning) SimPO's forward sets the peak: the logits and
    the rows' saved log-softmax outputs."""
    doc = docs["simpo-bf16-full"]
    row = compared_rows(doc)[0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    assert row["estimated_loss_logits"] == 2 * 2 * _logits(doc["results"][0], 2, False)


def test_orpo_in_bf16_differs_from_the_trace_by_its_out_of_place_gradient_sum(
    docs: dict[str, Any],
) -> None:
    """Without autocast ORPO's two paths to the logits (the log-probabilities and the chosen
    half's cross-entropy) each return a logits-sized bf16 gradient, which autograd sums: on
    CUDA in place into the first (torch/csrc/autograd/input_buffer.cpp `accumulate`: the
    engine holds the only reference), under the probe's dispatch mode out of place
    (probe/grad_sums.py), a third tensor. The estimate is CUDA's: the forward's logits, the
    rows' saved log-softmax and the chosen half's, 5 bytes per logit; the trace's sum holds
    three full bf16 logits, 6."""
    res, row = docs["orpo-bf16"]["results"][0], compared_rows(docs["orpo-bf16"])[0]
    full = 2 * _logits(res, 2, False)
    assert res["component_maxima"]["logits"] == 3 * full
    assert row["estimated_loss_logits"] == 2.5 * full
    cuda_sum = res["peak_allocated_bytes"] - full / 2  # the trace less the half it adds
    assert row["estimated_peak_bytes"] == pytest.approx(cuda_sum, rel=0.01)


def test_softcapped_logits_keep_the_policy_s_tanh(docs: dict[str, Any]) -> None:
    """Gemma 2 softcaps its logits in the model's forward: the tanh's saved bf16 output stays
    through the loss backward beside ORPO's 18 bytes per logit."""
    row = compared_rows(docs["orpo-gemma2"])[0]
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    assert row["estimated_loss_logits"] == 2 * 512 * 4096 * (4 * 4 + 2 + 2)


def test_a_chunked_loss_is_refused_naming_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL 1.8.0's ORPOTrainer reads the full logits: `--loss chunked` is refused naming it
    (in-process, the TRL check answering as TRL 1.8.0 would)."""
    import probe.trl_stack
    from probe.options import ProbeInputError, normalize_setup
    from probe.stacks import check_stack

    monkeypatch.setattr(probe.trl_stack, "fused_head_available", lambda: False)
    setup = normalize_setup({"stack": "hf", "method": "lora", "objective": "orpo"})
    with pytest.raises(ProbeInputError) as err:
        check_stack({**setup, "loss": "chunked"}, "fake")
    assert err.value.field == "setup.loss"
