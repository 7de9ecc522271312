"""The fast paths of issue 17 give what the one-at-a-time paths give: the estimate document's
time and cost cells (per-option rates, FLOPs once per row) equal `step_time` cell by cell, and
`sweep_full` equals `memory_breakdown` + `step_time` at sampled cells. No timings here: the
speed figures are printed by bench/speed.py (tests/test_bench_scripts.py only runs it)."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.document import estimate_document
from estimator.gpu_options import devices_for, parse_gpu_options
from estimator.memory import memory_breakdown
from estimator.model_source import resolve_model
from estimator.profile import load_profile
from estimator.request import EstimateRequest, ModelInput
from estimator.scenario import Scenario
from estimator.setup import TrainingSetup
from estimator.sweep import sweep_full
from estimator.time.step import step_time

GPUS = ["h100-80gb", "2xh200", "8xa100-80gb", "rtx-4090", "24gib"]
SETUPS = [
    {"method": "lora"},
    {"method": "full", "checkpointing": "offload", "loss": "chunked"},
    {"method": "full", "sharding": "fsdp", "num_gpus": 2},
    {"method": "qlora", "optimizer": "adamw-8bit", "checkpointing": "none"},
]


def _step(spec, setup, gpu_text, seq, batch, host, efficiency=None):  # type: ignore[no-untyped-def]
    option = parse_gpu_options([gpu_text])[0]
    sc = Scenario(
        spec,
        setup,
        load_profile("default"),
        seq,
        batch,
        gpu=option.gpu,
        count=devices_for(option, setup),
    )
    return step_time(sc, host_bytes=host, efficiency=efficiency)


@pytest.mark.parametrize("setup", SETUPS)
def test_document_cells_equal_step_time_cell_by_cell(setup: dict) -> None:
    req = EstimateRequest.model_validate(
        {
            "model": {"preset": "qwen3-8b"},
            "setup": setup,
            "seq_lens": [512, 8192, 40000],
            "gpus": GPUS,
            "tokens": 2e9,
        }
    )
    doc = estimate_document(req)
    spec = resolve_model(req.model)
    checked = 0
    for row in doc["rows"]:
        for option, fit in row["fit"].items():
            st = _step(spec, req.setup, option, row["seq_len"], row["batch"], row["host_bytes"])
            t = fit["time"]
            assert t["step_seconds"] == st.step_seconds
            assert t["tokens_per_second"] == st.tokens_per_second
            assert t["mfu"] == st.mfu
            assert t["comm_seconds"] == st.comm_seconds
            assert t["offload_seconds"] == st.offload_seconds
            assert t.get("unknown", []) == list(st.unknown)
            assert (t["wall_hours"], t["gpu_hours"]) == st.hours(2e9)
            assert row["flops_per_step"] == st.flops.total
            checked += 1
    assert checked == 3 * len(GPUS)


def test_sweep_counts_memory_evaluations_verdicts_and_full_cells_apart() -> None:
    spec = resolve_model(ModelInput(preset="llama-3.1-8b"))
    setup = TrainingSetup(method="lora")
    r = sweep_full(spec, setup, [1024, 2048, 4096], [1, 2], GPUS, load_profile("default"))
    assert r.cells == r.verdicts == 3 * 2 * len(GPUS)
    # h100-80gb, rtx-4090 and 24gib share one memory evaluation (1 card); 2 and 8 cards: two more
    assert r.memory_evaluations == 3 * 2 * 3


@pytest.mark.parametrize("setup", SETUPS)
def test_sweep_full_equals_the_one_cell_path(setup: dict) -> None:
    spec = resolve_model(ModelInput(preset="llama-3.1-8b"))
    ts = TrainingSetup.model_validate(setup)
    profile = load_profile("default")
    seqs, batches = [256, 3000, 65536], [1, 3]
    r = sweep_full(spec, ts, seqs, batches, GPUS, profile)
    for i, seq in enumerate(seqs):
        for j, batch in enumerate(batches):
            for g, option in enumerate(GPUS):
                n = devices_for(parse_gpu_options([option])[0], ts)
                mem = memory_breakdown(spec, ts, [seq], batch, profile, devices=n)
                assert r.peak[i, j, g] == float(mem.peak[0])
                host = int(np.ceil(float(mem.host[0])))
                st = _step(spec, ts, option, seq, batch, host)
                # FLOPs scaled from micro-batch 1: equal up to rounding
                assert r.flops[i, j] == pytest.approx(st.flops.total, rel=1e-12)
                if st.step_seconds is None:
                    assert np.isnan(r.step_seconds[i, j, g])
                else:
                    assert r.step_seconds[i, j, g] == pytest.approx(st.step_seconds, rel=1e-12)
                    assert r.tokens_per_second[i, j, g] == pytest.approx(
                        st.tokens_per_second, rel=1e-12
                    )


def test_scalar_verdict_is_the_vectorised_rule() -> None:
    from estimator.fit import verdict_code_list, verdict_codes

    cap = 85_520_809_984
    peaks = [0.0, cap * 0.92 - 1, cap * 0.92, cap * 0.92 + 1, cap - 0.5, cap, cap + 1.0, 1e30]
    for fraction in (0.92, 1.0, 0.5):
        codes = verdict_code_list(peaks, cap, fraction)
        for peak, code in zip(peaks, codes, strict=True):
            assert code == int(verdict_codes(peak, cap, fraction))


@pytest.mark.parametrize("preset", ["qwen3.5-27b", "llama-4-scout", "gpt-oss-20b", "deepseek-v3"])
@pytest.mark.parametrize("setup", SETUPS)
def test_flops_totals_are_step_flops_totals(preset: str, setup: dict) -> None:
    from estimator.lora import runnable_targets
    from estimator.time.flops import step_flops, step_flops_totals

    spec = resolve_model(ModelInput(preset=preset))
    ts = runnable_targets(spec, TrainingSetup.model_validate(setup))  # Llama 4's router
    for seq, batch in ((1, 1), (4096, 3), (131072, 1)):
        full = step_flops(spec, ts, seq, batch)
        assert tuple(step_flops_totals(spec, ts, seq, batch)) == (full.total, full.model_flops)
