"""Seed 003's 3060 table from params-only specs: 2 + 14 bytes per parameter (bf16 weights;
bf16 grads, fp32 master and AdamW moments), in decimal GB as the seed prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from estimator.document import estimate_document
from estimator.request import EstimateRequest

SEED = Path(__file__).parents[1] / "data" / "seeds" / "003_70c71c319d70b112.txt"


def seed_rows() -> list[tuple[str, float, float, str]]:
    text = SEED.read_text().split("## What fits on a single 3060", 1)[1].split("## What 8B", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            params = float(cells[1].rstrip("M")) * 1e6
            rows.append((cells[0].strip("`"), params, float(cells[2].split()[0]), cells[3]))
    return rows


def test_seed_003_table_has_five_presets() -> None:
    assert len(seed_rows()) == 5


@pytest.mark.parametrize("name,params,seed_gb,seed_verdict", seed_rows())
def test_params_only_memory_and_3060_verdict(
    name: str, params: float, seed_gb: float, seed_verdict: str
) -> None:
    doc = estimate_document(
        EstimateRequest.model_validate(
            {
                "model": {"params": params, "name": name},
                "setup": {"method": "full", "optimizer": "adamw", "precision": "mixed"},
                "seq_lens": [1024],
                "gpus": ["rtx-3060"],
                "profile": "default",
            }
        )
    )
    row = doc["rows"][0]
    weights_and_states = row["components"]["weights"] + row["components"]["trainable_states"]
    assert round(weights_and_states / 1e9, 1) == seed_gb
    assert row["peak_is_lower_bound"]
    assert set(row["not_computable"]) == {"checkpoints", "recompute_peak", "logits"}
    verdict = row["fit"]["rtx-3060"]["verdict"]
    assert (verdict == "fits") == seed_verdict.startswith("Full fine-tune")
