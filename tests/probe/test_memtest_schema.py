"""The memtest schema accepts what the probe writes and names the field of each problem."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from memtest_schema import (
    SCHEMA_ID,
    SETUP_FIELDS,
    STACK_SETUP_FIELDS,
    MemtestSchemaError,
    load_memtest,
    validate_memtest,
)


def _doc() -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "created_at": "2026-10-06T12:00:00Z",
        "tool": {"name": "trainfit-probe", "version": "0.1.0", "command": "trainfit-probe ..."},
        "environment": {
            "device": "cuda",
            "gpu_name": "NVIDIA H200",
            "total_memory_bytes": 150_000_000_000,
            "gpu_count": 1,
            "torch": "2.13.0",
            "cuda": "12.8",
            "transformers": "5.24.0",
            "peft": "0.21.2",
            "bitsandbytes": None,
            "memory_counter": "torch.cuda.max_memory_allocated",
            "attention_kernel": "sdpa:flash_attention",
            "linear_attention_kernel": None,
        },
        "model": {
            "name": "tiny",
            "model_type": "llama",
            "config": {"model_type": "llama"},
            "params_total": 1000,
            "params_trainable": 10,
        },
        "setup": {
            "method": "lora",
            "lora_rank": 16,
            "lora_alpha": None,
            "lora_targets": ["all-linear"],
            "adapter_dtype": "fp32",
            "optimizer": "adamw",
            "precision": "mixed",
            "checkpointing": "gpu",
            "loss": "full",
            "loss_chunk": 4096,
            "batch": 1,
            "sharding": "none",
            "num_gpus": 1,
            "attention": "sdpa",
        },
        "sweep": [1024, 2048, 4096],
        "results": [
            {
                "seq_len": 1024,
                "batch": 1,
                "status": "ok",
                "steps": 3,
                "peak_allocated_bytes": 123456,
                "peak_reserved_bytes": 200000,
                "step_seconds": [0.5, 0.25, 0.25],
                "tokens_per_second": 4096.0,
                "error": None,
                "components": None,
            },
            {
                "seq_len": 2048,
                "batch": 1,
                "status": "oom",
                "steps": 0,
                "peak_allocated_bytes": None,
                "peak_reserved_bytes": None,
                "step_seconds": [],
                "tokens_per_second": None,
                "error": "OutOfMemoryError: CUDA out of memory",
                "components": None,
            },
            {
                "seq_len": 4096,
                "batch": 1,
                "status": "skipped",
                "steps": 0,
                "peak_allocated_bytes": None,
                "peak_reserved_bytes": None,
                "step_seconds": [],
                "tokens_per_second": None,
                "error": None,
                "components": None,
            },
        ],
    }


def _raises(doc: dict[str, Any], field: str) -> MemtestSchemaError:
    with pytest.raises(MemtestSchemaError) as info:
        validate_memtest(doc)
    assert info.value.field == field, info.value
    return info.value


def test_valid_document_passes_and_round_trips_through_json():
    doc = _doc()
    assert validate_memtest(doc) is doc
    assert load_memtest(json.dumps(doc)) == doc
    assert load_memtest(json.dumps(doc).encode()) == doc


def test_setup_fields_are_the_estimators_training_setup_fields():
    setup_module = pytest.importorskip("estimator.setup")
    estimator_fields = set(setup_module.TrainingSetup.model_fields)
    # the base fields are required in a memtest; the stack fields (issue 10/11) are optional,
    # so the estimator may know them or not yet
    assert set(SETUP_FIELDS) <= estimator_fields
    assert estimator_fields - set(SETUP_FIELDS) <= set(STACK_SETUP_FIELDS)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stack", "keras"),
        ("autocast", "yes"),
        ("optimizer_impl", "magic"),
        ("lora_dropout", 1.0),
        ("lora_dropout", -0.1),
        ("grad_accum", 0),
        ("double_quant", 1),
        ("pp_schedule", "zigzag"),
        ("pp_virtual", 0),
        ("eval_batch", 0),
        ("eval_batch", "eight"),
        ("pp_virtual", "2"),
        ("padded_batches", "yes"),
    ],
)
def test_bad_stack_setup_fields_are_rejected_naming_the_field(key, value):
    doc = _doc()
    doc["setup"][key] = value
    _raises(doc, f"setup.{key}")


def test_stack_environment_and_component_maxima_are_checked_when_present():
    doc = _doc()
    doc["environment"].update(
        {"stack": "hf", "libraries": {"peft": None}, "ran": ["Trainer"], "substituted": []}
    )
    validate_memtest(doc)
    doc["environment"]["ran"] = "Trainer"
    _raises(doc, "environment.ran")
    doc = _doc()
    doc["results"][0]["component_maxima"] = {"weights": 1, "trainable_states": 1, "logits": 1}
    _raises(doc, "results[0].component_maxima.activations")
    doc = _doc()
    doc["results"][0]["device_memory"] = {"total_bytes": 10, "free_before_bytes": 8}
    _raises(doc, "results[0].device_memory.free_after_bytes")


def test_unknown_schema_version_is_rejected_naming_schema():
    doc = _doc()
    doc["schema"] = "trainfit.memtest/2"
    err = _raises(doc, "schema")
    assert "trainfit.memtest/2" in err.message


def test_truncated_json_is_rejected():
    text = json.dumps(_doc())[:-20]
    with pytest.raises(MemtestSchemaError) as info:
        load_memtest(text)
    assert "invalid JSON" in info.value.message


def test_duplicated_key_is_rejected_naming_the_key():
    text = json.dumps(_doc())
    text = text.replace('"sweep": [', '"sweep": [1], "sweep": [', 1)
    with pytest.raises(MemtestSchemaError) as info:
        load_memtest(text)
    assert info.value.field == "sweep"
    assert "duplicated" in info.value.message


def test_nan_and_infinity_are_rejected():
    text = json.dumps(_doc()).replace('"tokens_per_second": 4096.0', '"tokens_per_second": NaN')
    with pytest.raises(MemtestSchemaError, match="NaN"):
        load_memtest(text)


def test_top_level_must_be_an_object():
    with pytest.raises(MemtestSchemaError, match="object"):
        load_memtest("[1, 2]")


def test_seq_len_not_in_sweep_is_rejected_naming_the_result():
    doc = _doc()
    doc["results"][1]["seq_len"] = 3000
    _raises(doc, "results[1].seq_len")


def test_results_repeating_a_length_or_out_of_order_are_rejected():
    doc = _doc()
    doc["results"][1]["seq_len"] = 1024
    _raises(doc, "results[1].seq_len")
    doc = _doc()
    doc["results"].reverse()
    _raises(doc, "results[1].seq_len")


def test_negative_bytes_are_rejected_naming_the_field():
    doc = _doc()
    doc["results"][0]["peak_allocated_bytes"] = -1
    err = _raises(doc, "results[0].peak_allocated_bytes")
    assert ">= 0" in err.message


def test_booleans_are_not_integers():
    doc = _doc()
    doc["environment"]["gpu_count"] = True
    _raises(doc, "environment.gpu_count")


def test_ok_result_needs_a_peak():
    doc = _doc()
    doc["results"][0]["peak_allocated_bytes"] = None
    _raises(doc, "results[0].peak_allocated_bytes")


def test_missing_and_unknown_fields_are_named():
    doc = _doc()
    del doc["environment"]["torch"]
    _raises(doc, "environment.torch")
    doc = _doc()
    doc["setup"]["learning_rate"] = 1e-4
    _raises(doc, "setup.learning_rate")
    doc = _doc()
    doc["setup"]["optimizer"] = "adam"
    _raises(doc, "setup.optimizer")


def test_bad_step_seconds_and_components_are_named():
    doc = _doc()
    doc["results"][0]["step_seconds"] = [0.5, -1.0]
    _raises(doc, "results[0].step_seconds[1]")
    doc = _doc()
    doc["results"][0]["components"] = {"params": 1, "grads": 2, "optimizer": 3}
    _raises(doc, "results[0].components.activations")


def test_created_at_must_be_iso_utc():
    doc = _doc()
    doc["created_at"] = "yesterday"
    _raises(doc, "created_at")


def test_too_many_results_are_rejected():
    doc = _doc()
    doc["sweep"] = list(range(1, 1003))
    template = copy.deepcopy(doc["results"][0])
    doc["results"] = [dict(template, seq_len=s) for s in doc["sweep"]]
    _raises(doc, "sweep")


def test_ranks_must_name_lengths_of_the_sweep():
    doc = _doc()
    doc["ranks"] = [
        {"rank": 0, "seq_len": 1024, "peak_allocated_bytes": 5, "peak_reserved_bytes": None},
        {"rank": 1, "seq_len": 999, "peak_allocated_bytes": 5, "peak_reserved_bytes": None},
    ]
    _raises(doc, "ranks[1].seq_len")


def test_every_sweep_length_needs_a_result():
    doc = _doc()
    doc["results"].pop()
    _raises(doc, "results")
    doc["results"] = []
    _raises(doc, "results")


def test_steps_must_agree_with_step_seconds():
    doc = _doc()
    doc["results"][0]["steps"] = 2
    _raises(doc, "results[0].steps")


def test_a_duplicated_key_is_named_with_its_path():
    import json

    text = json.dumps(_doc()).replace('"seq_len": 2048,', '"seq_len": 2048, "seq_len": 2048,')
    with pytest.raises(MemtestSchemaError) as info:
        load_memtest(text)
    assert info.value.field == "results[1].seq_len"


def test_simulated_reserved_bytes_is_an_optional_non_negative_integer():
    doc = _doc()
    doc["results"][0]["simulated_reserved_bytes"] = 2 * 2**20
    validate_memtest(doc)
    for bad in ("2 MiB", -1, 1.5):
        doc["results"][0]["simulated_reserved_bytes"] = bad
        _raises(doc, "results[0].simulated_reserved_bytes")
