"""What `estimate()` memoises across requests (each GPU option's rates, the setup echo, the
assumptions) answers as a fresh computation would: keyed by every value that changes them, held
on copies, handed out as fresh objects."""

from __future__ import annotations

import json
from typing import Any

from estimator import document
from estimator.document import estimate_document
from estimator.request import EstimateRequest

BODY: dict[str, Any] = {
    "model": {"preset": "llama-3.1-8b"},
    "setup": {"method": "lora"},
    "seq_lens": [2048, 8192],
    "gpus": ["h100-80gb", "2xh200", "a100-40gb"],
    "tokens": 1e9,
}


def _clear() -> None:
    for memo in (document._RATES, document._SETUP_DUMPS, document._ASSUMPTIONS):
        memo.clear()


def _fresh(body: dict[str, Any]) -> str:
    """The document with every memo of document.py emptied first."""
    _clear()
    return json.dumps(estimate_document(EstimateRequest.model_validate(body)))


def _warm(body: dict[str, Any]) -> str:
    return json.dumps(estimate_document(EstimateRequest.model_validate(body)))


def test_warm_memos_give_the_fresh_document_for_each_variant() -> None:
    variants = [
        BODY,
        {**BODY, "setup": {"method": "lora", "checkpointing": "offload"}},
        {**BODY, "setup": {"method": "full", "sharding": "fsdp", "num_gpus": 2}},
        {**BODY, "prices": {"h100-80gb": 1.5}},
        {**BODY, "calibration": {"gpu": "h100-80gb", "seq_len": 2048, "step_seconds": 1.0}},
        {**BODY, "profile": "seed-000"},
    ]
    fresh = [_fresh(b) for b in variants]
    for _ in range(2):  # every memo warm, in another order each time
        for body, expected in reversed(list(zip(variants, fresh, strict=True))):
            assert _warm(body) == expected


def test_a_callers_setup_changed_after_the_call_changes_no_memoised_rate() -> None:
    body = {**BODY, "setup": {"method": "lora", "checkpointing": "offload"}}
    req = EstimateRequest.model_validate(body)
    first = _fresh(body)
    offload = json.loads(first)["rows"][0]["fit"]["h100-80gb"]["time"]["offload_seconds"]
    assert offload > 0  # the offloaded checkpoints cost time
    _clear()
    estimate_document(req)  # the memos filled from this request's setup
    req.setup.checkpointing = "gpu"  # a mutable pydantic model, changed by its owner
    assert _warm(body) == first


def test_the_document_parts_from_memos_are_fresh_objects() -> None:
    one = estimate_document(EstimateRequest.model_validate(BODY))
    one["setup"]["lora_targets"].append("changed")
    one["assumptions"]["memory"].clear()
    two = estimate_document(EstimateRequest.model_validate(BODY))
    assert "changed" not in two["setup"]["lora_targets"]
    assert two["assumptions"]["memory"]
