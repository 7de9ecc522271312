"""`objective` (estimator/objective.py): a DPO row is two sequences, padded to the longer; the
reference forward adds FLOPs, and under full fine-tuning its model's weights, stored and
sharded as the policy's; precomputed reference log-probabilities add neither. The referee
for the step itself is TRL's DPOTrainer (tests/probe/test_dpo_accuracy.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from estimator.architectures import spec_from_config
from estimator.memory import memory_breakdown
from estimator.presets import preset_config
from estimator.profile import load_profile
from estimator.setup import TrainingSetup
from estimator.time.flops import step_flops, step_flops_totals

SPEC = spec_from_config(preset_config("llama-3.1-8b"))
PROFILE = load_profile("default")
SEQ = 2048.0


def _memory(setup: TrainingSetup, batch: Any = 1, devices: int | None = None) -> Any:
    return memory_breakdown(SPEC, setup, SEQ, batch, PROFILE, devices)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_a_dpo_row_under_peft_is_two_padded_sequences(method: str) -> None:
    dpo = TrainingSetup(method=method, objective="dpo")
    assert dpo.padded_batches  # the collator pads chosen and rejected to the longer
    sft = TrainingSetup(method=method, batch=2, padded_batches=True)
    assert _memory(dpo).peak == _memory(sft, 2).peak
    assert _memory(dpo, 3).peak == _memory(sft, 6).peak


def test_a_stated_padding_stands() -> None:
    assert not TrainingSetup(objective="dpo", padded_batches=False).padded_batches


def test_full_fine_tuning_holds_the_reference_model_as_the_policys_weights() -> None:
    dpo = _memory(TrainingSetup(objective="dpo"))
    pre = _memory(TrainingSetup(objective="dpo-precomputed"))
    sft = _memory(TrainingSetup(batch=2, padded_batches=True), 2)
    assert pre.peak == sft.peak  # no reference model in the step
    policy = sft.components["weights"]
    assert dpo.components["weights"] == pytest.approx(2 * policy, rel=1e-12)
    assert dpo.peak == pytest.approx(sft.peak + policy, rel=1e-9)


def test_the_reference_model_is_sharded_as_the_policy() -> None:
    """FSDP over 8 cards: TRL prepares the reference model with FSDP too (trl 1.16.0
    dpo_trainer.py:984-990), so it adds the policy's shard, not a whole model."""
    setup = dict(num_gpus=8, parallel="fsdp")
    dpo = _memory(TrainingSetup(objective="dpo", **setup), 1, 8)
    pre = _memory(TrainingSetup(objective="dpo-precomputed", **setup), 1, 8)
    added = dpo.components["weights"] - pre.components["weights"]
    whole = _memory(TrainingSetup(batch=2, padded_batches=True), 2).components["weights"]
    assert 0 < added < whole / 4


def test_the_reference_forward_is_one_more_forward_without_the_adapters() -> None:
    for method in ("full", "lora"):
        dpo = step_flops(SPEC, TrainingSetup(method=method, objective="dpo"), 2048, 1)
        sft = step_flops(SPEC, TrainingSetup(method=method, batch=2), 2048, 2)
        lora = sft.parts["lora"].forward if "lora" in sft.parts else 0.0
        assert dpo.reference == pytest.approx(sft.forward - lora, rel=1e-12)
        assert dpo.total == pytest.approx(sft.total + dpo.reference, rel=1e-12)
        totals = step_flops_totals(SPEC, TrainingSetup(method=method, objective="dpo"), 2048, 1)
        assert totals.total == pytest.approx(dpo.total, rel=1e-12)
        pre = step_flops(SPEC, TrainingSetup(method=method, objective="dpo-precomputed"), 2048, 1)
        assert pre.reference == 0.0 and pre.total == pytest.approx(sft.total, rel=1e-12)


@pytest.mark.parametrize("objective", ["dpo", "dpo-precomputed"])
def test_dpo_memory_grows_with_the_pairs(objective: str) -> None:
    setup = TrainingSetup(objective=objective, method="lora")
    peaks = [float(_memory(setup, b).peak) for b in (1, 2, 4)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"stack": "unsloth"}, "objective"),
        ({"loss": "liger"}, "loss"),
        ({"eval_batch": 4}, "eval_batch"),
        ({"num_gpus": 4, "parallel": "fsdp=2,tp=2"}, "parallel"),
    ],
)
def test_a_dpo_setup_not_modelled_names_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}: "):
        TrainingSetup(objective="dpo", **fields)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    import json

    from trainfit.cli import main

    capsys.readouterr()
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_recommend_tries_only_what_dpo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The grids that try losses and layouts without validating each (recommend, min-gpus)
    keep to the fused head's loss and to data parallelism under DPO."""
    args = ("--model", "llama-3.1-70b", "--method", "full", "--objective", "dpo", "--seq", "4096")
    doc = _json(capsys, "recommend", *args, "--gpu", "8xh100-80gb,h100-80gb")
    tried = [row for row in doc["rows"] if "loss" in row]  # a card nothing fits has none
    assert tried
    for row in tried:
        assert row["loss"] == "chunked"
        assert not any(k in str(row["parallel"]) for k in ("tp=", "pp=", "cp=", "ep="))
    lora = ("--model", "llama-3.1-8b", "--method", "lora", "--objective", "dpo", "--seq", "8192")
    rows = _json(capsys, "recommend", *lora, "--gpu", "h100-80gb,rtx-4090")["rows"]
    assert {row.get("loss") for row in rows} == {"chunked"}
    # TRL 1.0-1.9's DPOTrainer (axolotl's pin) makes the full logits: the grids keep that
    rows = _json(capsys, "recommend", *lora, "--loss", "full", "--gpu", "h100-80gb")["rows"]
    assert {row.get("loss") for row in rows} == {"full"}
    minimum = _json(capsys, "min-gpus", *lora, "--loss", "full", "--gpu", "h100-80gb")
    assert "chunked" not in json.dumps(minimum)


def test_a_params_only_model_gets_the_reference_forward_too() -> None:
    from estimator.spec import params_only_spec

    spec = params_only_spec(7e9)
    dpo = step_flops(spec, TrainingSetup(objective="dpo"), 1024, 1)
    sft = step_flops(spec, TrainingSetup(batch=2), 1024, 2)
    assert dpo.reference == sft.forward == 2.0 * 7e9 * 2048
    assert dpo.total == sft.total + dpo.reference
    assert step_flops_totals(spec, TrainingSetup(objective="dpo"), 1024, 1).total == dpo.total


def test_max_batch_counts_preference_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    from trainfit.cli import main

    args = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "4096", "--gpu", "h100-80gb")
    pairs = _json(capsys, "max-batch", *args, "--objective", "dpo")["batch"]
    rows = _json(capsys, "max-batch", *args, "--padded-batches")["batch"]
    assert pairs == rows // 2 and pairs > 1
    capsys.readouterr()
    assert main(["max-batch", *args, "--objective", "dpo"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(f": {pairs} preference pairs")


def _loss_logits(setup: TrainingSetup, batch: int = 1) -> float:
    return float(_memory(setup, batch).loss_logits)


@pytest.mark.parametrize("objective", ["dpo", "dpo-precomputed"])
def test_trl_1_9_dpo_under_autocast_holds_four_fp32_logits(objective: str) -> None:
    """TRL 1.0-1.9's DPOTrainer (`loss full`): under autocast accelerate returns fp32 logits and
    the loss's backward holds four logits-sized fp32 tensors, with or without a reference
    (`preference_full_logits_bytes`; the referee is tests/probe/test_dpo_full_logits.py)."""
    setup = TrainingSetup(method="lora", objective=objective, loss="full")
    logits = 2 * SEQ * SPEC.vocab  # a pair: two sequences
    assert _loss_logits(setup) == pytest.approx(4 * 4 * logits, rel=1e-12)
    assert _loss_logits(setup, 2) == pytest.approx(2 * 4 * 4 * logits, rel=1e-12)


def test_trl_1_9_dpo_in_bf16_peaks_in_the_forward_with_the_reference_logits() -> None:
    """Without autocast the logits stay bf16: the policy's, their saved log-softmax, the
    reference's and the entropy metric's copy, and three 128-row chunks of that metric."""
    setup = dict(method="lora", loss="full", precision="bf16", autocast=False)
    chunk = 128 * SPEC.vocab * 3 * 2
    logits = 2 * SEQ * SPEC.vocab
    dpo = _loss_logits(TrainingSetup(objective="dpo", **setup))
    assert dpo == pytest.approx(4 * 2 * logits + chunk, rel=1e-12)
    pre = _loss_logits(TrainingSetup(objective="dpo-precomputed", **setup))
    assert pre == pytest.approx(3 * 2 * logits + chunk, rel=1e-12)


def test_trl_1_9_dpo_costs_more_than_the_fused_head_and_than_sft() -> None:
    full = _memory(TrainingSetup(method="lora", objective="dpo", loss="full")).peak
    fused = _memory(TrainingSetup(method="lora", objective="dpo")).peak
    sft = _memory(TrainingSetup(method="lora", loss="full", batch=2, padded_batches=True), 2).peak
    assert full > sft > fused


@pytest.mark.parametrize(("objective", "per_logit"), [("orpo", 18), ("cpo", 18), ("simpo", 16)])
def test_orpo_and_cpo_add_the_chosen_half_s_log_softmax(objective: str, per_logit: int) -> None:
    """TRL 1.0-1.9's ORPOTrainer and CPOTrainer under autocast: DPO's four fp32 logits-sized
    tensors in the log-probabilities' backward, plus (unless cpo_alpha is 0) the chosen half's
    saved fp32 log-softmax; the loss is the full logits without being asked."""
    setup = TrainingSetup(method="lora", objective=objective)
    assert setup.loss == "full"
    logits = 2 * SEQ * SPEC.vocab  # a pair: two sequences
    assert _loss_logits(setup) == pytest.approx(per_logit * logits, rel=1e-12)
    assert _loss_logits(setup, 3) == pytest.approx(3 * per_logit * logits, rel=1e-12)


@pytest.mark.parametrize(("objective", "per_logit"), [("orpo", 5), ("simpo", 4)])
def test_orpo_and_simpo_in_bf16_peak_in_the_forward(objective: str, per_logit: int) -> None:
    """Without autocast: the bf16 logits, the rows' saved log-softmax outputs and (ORPO) the
    chosen half's."""
    setup = TrainingSetup(method="lora", objective=objective, precision="bf16", autocast=False)
    logits = 2 * SEQ * SPEC.vocab
    assert _loss_logits(setup) == pytest.approx(per_logit * logits, rel=1e-12)


@pytest.mark.parametrize("objective", ["orpo", "cpo", "simpo"])
def test_the_policy_only_trainers_keep_no_reference(objective: str) -> None:
    """No reference model: full fine-tuning holds one set of weights and each step runs no
    reference forward, while the step is still a pair of sequences."""
    full = dict(method="full", loss="full")
    policy_only = _memory(TrainingSetup(objective=objective, **full))
    dpo = _memory(TrainingSetup(objective="dpo", **full))
    sft = _memory(TrainingSetup(batch=2, padded_batches=True, **full), 2)
    assert policy_only.components["weights"] == sft.components["weights"]
    assert dpo.components["weights"] == pytest.approx(2 * sft.components["weights"], rel=1e-12)
    ours = step_flops(SPEC, TrainingSetup(objective=objective, **full), SEQ, 1)
    sft_pair = step_flops(SPEC, TrainingSetup(batch=2, **full), SEQ, 2)
    assert ours.reference == 0.0
    assert ours.total == pytest.approx(sft_pair.total, rel=1e-12)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"loss": "chunked"}, "loss"),
        ({"loss": "liger"}, "loss"),
        ({"stack": "unsloth"}, "objective"),
        ({"eval_batch": 2}, "eval_batch"),
        ({"num_gpus": 4, "parallel": "fsdp=2,tp=2"}, "parallel"),
    ],
)
@pytest.mark.parametrize("objective", ["orpo", "simpo"])
def test_a_policy_only_setup_not_modelled_names_the_field(
    objective: str, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=f"{field}: "):
        TrainingSetup(objective=objective, **fields)


def test_kto_holds_four_logits_sized_tensors_over_its_rows() -> None:
    """TRL 1.0-1.9's KTOTrainer: one sequence a row; under autocast the policy's fp32 logits,
    the labels' index_select copies, the reference's logits and the entropy copy, with the
    metric's 128-row chunks; without autocast also the rows' saved bf16 log-softmax."""
    setup = TrainingSetup(method="lora", objective="kto")
    assert (setup.batch, setup.loss, setup.padded_batches) == (2, "full", True)
    logits = SEQ * SPEC.vocab  # one row: one sequence
    chunks = 128 * SPEC.vocab * 3
    assert _loss_logits(setup, 2) == pytest.approx(2 * 4 * 4 * logits + 4 * chunks, rel=1e-12)
    bf16 = TrainingSetup(method="lora", objective="kto", precision="bf16", autocast=False)
    assert _loss_logits(bf16, 2) == pytest.approx(2 * 5 * 2 * logits + 2 * chunks, rel=1e-12)


def test_kto_runs_two_reference_forwards_and_the_policy_s_kl_forward() -> None:
    """The reference's forwards of the rows and of the KL rows, and the policy's of the KL
    rows, all under no_grad (trl v1.8.0 kto_trainer.py:1289-1320, 1524-1535)."""
    for method in ("full", "lora"):
        kto = step_flops(SPEC, TrainingSetup(method=method, objective="kto"), 2048, 2)
        sft = step_flops(SPEC, TrainingSetup(method=method, batch=2), 2048, 2)
        lora = sft.parts["lora"].forward if "lora" in sft.parts else 0.0
        assert kto.reference == pytest.approx(2 * (sft.forward - lora) + sft.forward, rel=1e-12)
        assert kto.total == pytest.approx(sft.total + kto.reference, rel=1e-12)
        totals = step_flops_totals(SPEC, TrainingSetup(method=method, objective="kto"), 2048, 2)
        assert totals.total == pytest.approx(kto.total, rel=1e-12)
    full = _memory(TrainingSetup(method="full", objective="kto"), 2)
    sft = _memory(TrainingSetup(method="full", batch=2, padded_batches=True), 2)
    assert full.components["weights"] == pytest.approx(2 * sft.components["weights"], rel=1e-12)


def test_kto_needs_two_rows_a_micro_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """KTOTrainer raises below two rows (kto_trainer.py:785-789): a stated batch of 1 names the
    batch, and max-batch answers none where two rows do not fit."""
    with pytest.raises(ValueError, match="batch: KTOTrainer"):
        TrainingSetup(method="lora", objective="kto", batch=1)
    args = ("--model", "llama-3.1-8b", "--method", "lora", "--gpu", "h100-80gb")
    rows = _json(capsys, "max-batch", *args, "--seq", "4096", "--objective", "kto")["batch"]
    assert rows >= 2
    from trainfit.cli import main

    capsys.readouterr()
    argv = ["max-batch", *args, "--seq", "40000", "--objective", "kto", "--format", "json"]
    assert main(argv) == 1  # nothing fits
    long = json.loads(capsys.readouterr().out)
    assert long["batch"] is None and "batch = 2" in long["reason"]
