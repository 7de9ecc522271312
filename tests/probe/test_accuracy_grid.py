"""bench/accuracy.py covers what issue 11 asks it to cover (checked without running it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
accuracy = pytest.importorskip("bench.accuracy")


def test_the_grid_covers_the_issue_11_dimensions():
    cases = accuracy.grid(quick=False)
    setups = [{**accuracy.BASE, **c.setup} for c in cases]

    def values(key):
        return {s.get(key) for s in setups}

    assert {c.config for c in cases} == set(accuracy.CONFIGS)
    assert {"small-qwen3-moe", "small-qwen3.5"} <= set(accuracy.CONFIGS)  # MoE and the hybrid
    assert {"full", "lora", "qlora"} <= values("method")
    assert {0.0, 0.05} <= values("lora_dropout")
    assert {1, 4} <= values("batch") and {1, 4} <= values("grad_accum")
    assert {"none", "gpu", "offload"} <= values("checkpointing")
    assert {"full", "chunked"} <= values("loss")
    assert {False} <= values("autocast")  # and the hf default (None -> on)
    assert len(accuracy.SEQS) >= 2
    # every config's base case is measured on the CPU and checked against its fake trace,
    # except the hybrid (fake only: the CPU runs transformers' fallback kernel)
    for config in accuracy.CONFIGS:
        base = next(c for c in cases if c.config == config)
        expected = ["fake"] if config in accuracy.FAKE_ONLY else ["cpu", "fake"]
        assert base.devices == expected, config
    # QLoRA cannot be traced with fake tensors: it runs on the CPU
    assert all(c.devices == ["cpu"] for c in cases if c.setup.get("method") == "qlora")


def test_the_estimator_cannot_express_list_names_the_stack_fields_it_lacks():
    setup = {
        "stack": "hf", "autocast": True, "lora_dropout": 0.05, "grad_accum": 2,
        "optimizer_impl": "fused", "method": "lora", "precision": "mixed",
    }  # fmt: skip
    missing = accuracy.cannot_express(setup, known={"method", "precision"})
    assert missing[:5] == [
        "stack=hf", "autocast=True", "lora_dropout=0.05", "grad_accum=2", "optimizer_impl=fused",
    ]  # fmt: skip
    everything = set(accuracy.STACK_FIELDS) | {"method", "precision"}
    assert accuracy.cannot_express(setup, known=everything) == []
