"""Seed 000's tables, parsed from the seed document itself, against what the code computes
with `--profile seed-000`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from estimator.document import estimate_document
from estimator.request import EstimateRequest
from tests.estimator.seed_case import SEED_TARGETS

SEED = Path(__file__).parents[1] / "data" / "seeds" / "000_e5ae281323c78e0d.txt"
GIB = 2**30
TARGETS = SEED_TARGETS
GPU_COLUMNS = ["a100-80gb", "rtx-pro-6000", "h200", "2xh200"]


def _table(heading: str) -> list[list[str]]:
    rows: list[list[str]] = []
    for line in SEED.read_text().split(heading, 1)[1].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def seed_fit_table() -> list[dict[str, object]]:
    out = []
    for cells in _table("## Fit by GPU"):
        seq = int(cells[0].rstrip("k")) * 1000
        checkpointing = "offload" if "offload" in cells[1] else "gpu"
        loss = "chunked" if cells[2] == "chunked" else "full"
        out.append(
            {
                "seq": seq,
                "checkpointing": checkpointing,
                "loss": loss,
                "peak": float(cells[3]),
                "verdicts": cells[4:8],
            }
        )
    return out


def seed_document() -> dict:
    req = EstimateRequest.model_validate(
        {
            "model": {"preset": "qwen3.5-27b"},
            "setup": {
                "method": "lora",
                "lora_rank": 16,
                "lora_targets": TARGETS,
                "optimizer": "adamw-8bit",
            },
            "seq_lens": [16000, 32000, 48000],
            "gpus": GPU_COLUMNS,
            "profile": "seed-000",
        }
    )
    variants = [
        {"checkpointing": c, "loss": lo} for c in ("offload", "gpu") for lo in ("chunked", "full")
    ]
    return estimate_document(req, variants)


def test_seed_table_parses_to_48_cells() -> None:
    table = seed_fit_table()
    assert len(table) == 12
    assert sum(len(r["verdicts"]) for r in table) == 48


@pytest.mark.parametrize(
    "seed_row", seed_fit_table(), ids=lambda r: f"{r['seq']}-{r['checkpointing']}-{r['loss']}"
)
def test_fit_table_row_matches_seed(seed_row: dict) -> None:
    doc = seed_document()
    row = next(
        r
        for r in doc["rows"]
        if r["seq_len"] == seed_row["seq"]
        and r["checkpointing"] == seed_row["checkpointing"]
        and r["loss"] == seed_row["loss"]
    )
    assert round(row["peak_bytes"] / GIB) == round(seed_row["peak"])
    assert [row["fit"][g]["verdict"] for g in GPU_COLUMNS] == seed_row["verdicts"]


def test_component_table_at_48k_matches_seed() -> None:
    figures = {}
    for cells in _table("## Memory by component at 48k tokens"):
        numbers = re.findall(r"\d+(?:\.\d+)?", cells[1])
        figures[cells[0]] = [float(n) for n in numbers]
    doc = seed_document()
    gpu_chunked = next(
        r
        for r in doc["rows"]
        if r["seq_len"] == 48000 and r["checkpointing"] == "gpu" and r["loss"] == "chunked"
    )
    gpu_full = next(
        r
        for r in doc["rows"]
        if r["seq_len"] == 48000 and r["checkpointing"] == "gpu" and r["loss"] == "full"
    )
    offload = next(
        r
        for r in doc["rows"]
        if r["seq_len"] == 48000 and r["checkpointing"] == "offload" and r["loss"] == "chunked"
    )
    c = gpu_chunked["components"]
    assert round(c["weights"] / GIB, 1) == figures["weights bf16"][0]
    assert round(c["trainable_states"] / GIB, 1) == figures["LoRA weights + grads + 8-bit Adam"][0]
    ckpt = figures["layer inputs for the backward pass (checkpoints)"]
    assert round(c["checkpoints"] / GIB, 1) == ckpt[0]
    assert round(offload["components"]["checkpoints"] / GIB) == 0
    assert round(offload["host_bytes"] / GIB) == round(ckpt[0])
    assert round(c["recompute_peak"] / GIB, 1) == figures["recompute peak of one layer"][0]
    logits = figures["logits and loss"]
    assert round(c["logits"] / GIB) == logits[0]
    assert round(gpu_full["components"]["logits"] / GIB) == logits[1]


def test_seed_trainable_count_from_config() -> None:
    doc = seed_document()
    assert doc["model"]["params_trainable"] == 108_789_760
    assert round(doc["model"]["params_in_weights"] / 1e9, 1) == 27.8
