"""The probe loop's optimizer runs the implementation its setup names, on the CPU as on CUDA.

torch picks AdamW's foreach path by default only for devices with foreach kernels (cuda, xpu,
mtia: torch/optim/optimizer.py `_default_to_fused_or_foreach`); left to that default a CPU step
runs the per-tensor loop, whose temporaries are one tensor's, not the whole group's
`exp_avg_sq.sqrt()` of `_multi_tensor_adam`. The probe sets the implementation explicitly.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from probe import run_probe  # noqa: E402
from probe.options import ProbeInputError  # noqa: E402
from probe.stacks import check_stack  # noqa: E402
from tests.probe.conftest import load  # noqa: E402

FULL_BF16 = {"method": "full", "precision": "bf16", "checkpointing": "none"}


def _result(doc):
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    return res


def test_a_cpu_adamw_step_holds_the_whole_groups_sqrt_buffer():
    cfg = load("tiny-llama")
    doc = run_probe(cfg, FULL_BF16, [64], steps=2, device="cpu")
    res = _result(doc)
    # the second step's states: exp_avg + exp_avg_sq, bf16 like the weights; foreach holds one
    # exp_avg_sq-sized buffer for the whole group at once (the per-tensor loop: the largest
    # tensor's two, sqrt and the division, a fraction of it for this model)
    params = doc["model"]["params_total"]
    exp_avg_sq = 2 * params
    assert res["component_maxima"]["optimizer_step"] >= exp_avg_sq


def test_the_fused_adamw_step_has_no_group_buffer():
    cfg = load("tiny-llama")
    foreach = _result(run_probe(cfg, FULL_BF16, [64], steps=2, device="cpu"))
    fused_setup = {**FULL_BF16, "optimizer_impl": "fused"}
    doc = run_probe(cfg, fused_setup, [64], steps=2, device="cpu")
    fused = _result(doc)
    assert doc["setup"]["optimizer_impl"] == "fused"
    # torch._fused_adamw_ updates in place: no state-sized temporary
    assert fused["component_maxima"]["optimizer_step"] < 2 * doc["model"]["params_total"] // 8
    assert foreach["component_maxima"]["optimizer_step"] >= 2 * doc["model"]["params_total"]


@pytest.mark.parametrize("setup", [FULL_BF16, {"method": "full", "precision": "mixed"}])
def test_cpu_and_fake_adamw_steps_agree(setup):
    # fake mode models CUDA (foreach); the CPU step now runs the same path, so the peaks and
    # the components at the peak are equal (MasterWeights: one foreach AdamW per tensor)
    cfg = load("tiny-llama")
    real = _result(run_probe(cfg, setup, [64], steps=2, device="cpu"))
    fake = _result(run_probe(cfg, setup, [64], steps=2, device="fake"))
    assert fake["peak_allocated_bytes"] == real["peak_allocated_bytes"]
    assert fake["components"] == real["components"]
    assert fake["component_maxima"] == real["component_maxima"]


def test_the_probe_stack_refuses_fused_for_other_optimizers():
    from probe.options import normalize_setup

    setup = normalize_setup({"optimizer": "sgd", "optimizer_impl": "fused"})
    with pytest.raises(ProbeInputError) as err:
        check_stack(setup, "cpu")
    assert err.value.field == "setup.optimizer_impl"
