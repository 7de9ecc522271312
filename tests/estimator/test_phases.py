"""The estimate document names the moment of the step that makes the peak and what is alive
then (the web chart draws exactly that): its parts + overhead + allocator slack = peak."""

from __future__ import annotations

import pytest

from estimator.document import estimate_document
from estimator.request import EstimateRequest
from tests.estimator.seed_case import SEED_TARGETS


def _doc(profile: str, **setup: object) -> dict:
    base = {
        "method": "lora",
        "lora_rank": 16,
        "lora_targets": SEED_TARGETS,
        "optimizer": "adamw-8bit",
        "checkpointing": "gpu",
        "loss": "full",
    }
    return estimate_document(
        EstimateRequest.model_validate(
            {
                "model": {"preset": "qwen3.5-27b"},
                "setup": {**base, **setup},
                "seq_lens": [16000, 48000],
                "gpus": ["h200", "2xh200"],
                "profile": profile,
            }
        )
    )


@pytest.mark.parametrize(
    ("profile", "setup"),
    [
        ("default", {}),
        ("default", {"loss": "chunked"}),
        ("default", {"method": "full", "optimizer": "adamw", "checkpointing": "offload"}),
        ("default", {"grad_accum": 4}),
        ("seed-000", {}),
    ],
)
def test_peak_phase_parts_add_up_to_the_peak(profile: str, setup: dict) -> None:
    for row in _doc(profile, **setup)["rows"]:
        places = [row, *(f for f in row["fit"].values() if "phases" in f)]
        for where in places:
            phases, peak_phase = where["phases"], where["peak_phase"]
            totals = {name: sum(parts.values()) for name, parts in phases.items()}
            assert totals[peak_phase] == max(totals.values())
            slack = where["reserved_bytes"] - where["allocated_bytes"]
            overhead = (where.get("components") or row["components"])["overhead"]
            # each part is rounded up to a byte on its own: a few bytes over at most
            assert 0 <= totals[peak_phase] + overhead + slack - where["peak_bytes"] <= 8


def test_seed_profile_has_one_moment_and_the_default_three() -> None:
    assert list(_doc("seed-000")["rows"][0]["phases"]) == ["all"]
    assert list(_doc("default")["rows"][0]["phases"]) == ["loss", "backward", "step"]


def test_full_logits_at_long_context_peak_in_the_loss() -> None:
    rows = _doc("default")["rows"]
    assert rows[-1]["peak_phase"] == "loss"  # 48k tokens x 248k vocab of fp32 logits
    loss = rows[-1]["phases"]["loss"]
    assert loss["logits"] == rows[-1]["components"]["logits"]
    assert "recompute_peak" not in loss  # not alive when the loss is computed


def test_memtest_comparison_splits_the_estimate_as_the_probe_does() -> None:
    """params + grads + optimizer + activations + cuBLAS's workspaces (no tensor storage, so
    in no memtest component) = the estimated allocated peak; gradients count only when alive
    at the peak moment (not in the loss phase)."""
    from estimator.compare import compare
    from estimator.presets import preset_config

    kinds = {"params": 1, "grads": 1, "optimizer": 1, "activations": 1, "host": 1}
    doc = {
        "model": {"name": "qwen3.5-27b", "config": preset_config("qwen3.5-27b")},
        "setup": {
            "stack": "hf",
            "method": "lora",
            "lora_targets": SEED_TARGETS,
            "optimizer": "adamw-8bit",
            "checkpointing": "gpu",
            "loss": "full",
        },
        "environment": {"device": "cuda", "gpu_count": 1},
        "results": [
            {"seq_len": s, "status": "ok", "peak_allocated_bytes": 1, "components": kinds}
            for s in (1024, 48000)
        ],
    }
    rows = compare(doc)["rows"]
    for row in rows:
        parts = {k: v["estimated"] for k, v in row["components_vs_measured"].items()}
        device = parts["params"] + parts["grads"] + parts["optimizer"] + parts["activations"]
        workspaces = row["estimated_cublas_workspace_bytes"]
        assert workspaces == 2 * 32 * 2**20  # two threads' workspaces on a CUDA memtest
        assert abs(device + workspaces - row["estimated_peak_bytes"]) <= 4
        assert row["estimated_reserved_bytes"] >= row["estimated_peak_bytes"]
    assert rows[-1]["components_vs_measured"]["grads"]["estimated"] == 0  # loss-phase peak
