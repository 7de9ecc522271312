"""`objective: kto` against TRL 1.8.0's own KTOTrainer step, on the CPU (TRL 1.8.0 first on the
path: tests/probe/trl_1_8.py). The fake trace cannot take it: KTOTrainer splits each batch by its
labels with `torch.nonzero` (trl v1.8.0 trl/trainer/kto_trainer.py:1508-1514), which the fake
trace reads as every row; on real tensors the split is the run's.

A step runs the policy's KL forward (no grad), the policy's forward and backward of the rows, and
the reference's forwards; the loss holds the policy's logits, the reference's, the desirable and
undesirable rows' `index_select` copies and the entropy metric's copy
(`preference_full_logits_bytes`, estimator/memory/logits.py): under autocast 16 bytes per fp32
logit of the rows and the entropy's chunks, without it 10 (five bf16 logits-sized tensors).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.probe.trl_1_8 import (  # noqa: E402
    BF16,
    LORA,
    VOCAB,
    Run,
    compared_rows,
    needs_trl_1_8,
    probe_runs,
)

SEQ = 256
PAIR = (*LORA, "--batch", "2")
RUNS = {
    "autocast": Run("kto", PAIR, str(SEQ), device="cpu"),
    "bf16": Run("kto", (*PAIR, *BF16), str(SEQ), device="cpu"),
    "full": Run("kto", ("--method", "full", "--batch", "2"), str(SEQ), device="cpu"),
}

pytestmark = needs_trl_1_8


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The memtests of TRL 1.8.0's KTOTrainer steps on the CPU, one interpreter for all."""
    out = probe_runs(tmp_path_factory.mktemp("kto-full"), RUNS)
    for doc in out.values():
        assert doc["environment"]["ran"][0].startswith("TRL 1.8.0 KTOTrainer.train()")
    return out


def _measured(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return doc["results"][0], compared_rows(doc)[0]


def test_autocast_holds_four_fp32_logits_and_the_entropy_chunks(docs: dict[str, Any]) -> None:
    """LoRA under autocast: the policy's fp32 logits, the labels' index_select copies, the
    reference's logits and the entropy metric's copy, each fp32 and logits-sized, beside the
    metric's 128-row chunks; priced as SFT (as axolotl's `rl: kto` was), far under."""
    res, row = _measured(docs["autocast"])
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    logits = 2 * SEQ * VOCAB * 4
    shifted = 2 * (SEQ - 1) * VOCAB * 4
    chunks = 3 * 128 * VOCAB * 4
    assert res["component_maxima"]["logits"] == 3 * logits + shifted + chunks
    assert row["estimated_loss_logits"] == 4 * logits + chunks


def test_bf16_holds_five_logits_sized_tensors(docs: dict[str, Any]) -> None:
    """Without autocast the rows' saved log-softmax outputs join the four (bf16)."""
    res, row = _measured(docs["bf16"])
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    assert row["estimated_loss_logits"] == 5 * 2 * SEQ * VOCAB * 2 + 3 * 128 * VOCAB * 2


def test_full_fine_tuning_holds_the_reference_model(docs: dict[str, Any]) -> None:
    """AMP full fine-tuning: KTOTrainer loads a reference model in the policy's dtype (here
    built from the config and passed as ref_model, as DPO's), fp32 like the policy's weights.
    The probe's `weights` are the policy's (the reference's fall under its other storages), so
    the estimate's are twice them, and the peak agrees."""
    res, row = _measured(docs["full"])
    assert abs(row["error_pct"]) <= 1.0, row["error_pct"]
    weights = row["estimated_components"]["weights"]
    # rel 1e-4: the tracker rounds each storage up to whole blocks
    assert weights == pytest.approx(2 * res["component_maxima"]["weights"], rel=1e-4)


@pytest.mark.parametrize(
    ("change", "device", "field"),
    [({}, "fake", "setup.objective"), ({"batch": 1}, "cpu", "setup.batch")],
)
def test_kto_the_probe_cannot_run_is_refused_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], device: str, field: str
) -> None:
    """The fake trace reads the label split as every row (naming the objective); one row a
    micro-batch KTOTrainer refuses itself (naming the batch). In-process, with the TRL check
    answering as TRL 1.8.0 would (no fused kernels)."""
    import probe.trl_stack
    from probe.options import ProbeInputError, normalize_setup
    from probe.stacks import check_stack

    monkeypatch.setattr(probe.trl_stack, "fused_head_available", lambda: False)
    setup = normalize_setup(
        {"stack": "hf", "method": "lora", "objective": "kto", "loss": "full", "batch": 2}
    )
    with pytest.raises(ProbeInputError) as err:
        check_stack({**setup, **change}, device)
    assert err.value.field == field
