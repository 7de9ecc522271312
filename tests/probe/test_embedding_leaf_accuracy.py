"""GPT-2 LoRA against TRL's own SFTTrainer step (fake trace): the embedding's output, a leaf
once `enable_input_require_grads` marks it (estimator/memory/embedding_leaf.py), is alive at the
step's peak beside the checkpoints (GPT-2 adds the position embeddings to it, so the first
layer's input is another tensor). Before the term: -0.71 % (1024 tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")

from estimator.document import compare_memtest  # noqa: E402
from probe import run_probe  # noqa: E402

CONFIG = json.loads(
    (Path(__file__).resolve().parents[2] / "bench" / "configs" / "small-gpt2.json").read_text()
)


@pytest.mark.parametrize("seq", [256, 1024])
def test_gpt2_lora_step_within_a_tenth_of_a_percent(seq: int) -> None:
    setup = {"stack": "hf", "method": "lora", "lora_rank": 8, "checkpointing": "gpu"}
    doc = run_probe(CONFIG, {**setup, "loss": "chunked"}, [seq], 2, "fake")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    row = compare_memtest(doc, "default")["rows"][0]
    assert abs(row["error_pct"]) <= 0.1, row["error_pct"]
    leaf = seq * CONFIG["n_embd"] * 2
    assert abs(row["error_bytes"]) < leaf  # the term is larger than what is left
