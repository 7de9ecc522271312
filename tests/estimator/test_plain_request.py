"""The command line's plain request (`estimator.plain_request`) is the pydantic request: the
same field tables as the models, and on generated bodies either the same values (and the same
fields set) or a deferral to the pydantic model, which then gives the user's error."""

from __future__ import annotations

import random
import types
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import pytest
from pydantic import ValidationError

from estimator import plain_request as plain
from estimator.request import CheckRequest, EstimateRequest, ModelInput
from estimator.setup import TrainingSetup

KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _kind(annotation: Any) -> tuple[str, bool, tuple[Any, ...]]:
    """(kind, None allowed, literal choices) of a model field's annotation."""
    args = get_args(annotation)
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in args
    if optional:
        (annotation,) = [a for a in args if a is not type(None)]
    origin = get_origin(annotation)
    if origin is Literal:
        return "literal", optional, get_args(annotation)
    if origin is list:
        item = get_args(annotation)[0]
        return f"{KINDS[item]}_list", optional, ()
    if origin is dict:
        return ("float_dict" if get_args(annotation)[1] is float else "dict"), optional, ()
    return KINDS[annotation], optional, ()


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            out.update(low=m.ge, low_open=False)
        elif isinstance(m, annotated_types.Gt):
            out.update(low=m.gt, low_open=True)
        elif isinstance(m, annotated_types.Le):
            out.update(high=m.le, high_open=False)
        elif isinstance(m, annotated_types.Lt):
            out.update(high=m.lt, high_open=True)
        elif isinstance(m, annotated_types.MinLen):
            out["min_len"] = m.min_length
        elif isinstance(m, annotated_types.MaxLen):
            out["max_len"] = m.max_length
    return out


@pytest.mark.parametrize(
    ("table", "model", "left_out"),
    [
        (plain.SETUP_FIELDS, TrainingSetup, ()),
        (plain.MODEL_FIELDS, ModelInput, ()),
        (plain.REQUEST_FIELDS, EstimateRequest, ("train_config", "model", "setup", "calibration")),
        (plain.CHECK_FIELDS, CheckRequest, ("train_config", "model", "setup")),
    ],
)
def test_field_tables_are_the_models_fields(
    table: dict[str, plain.Field], model: Any, left_out: tuple[str, ...]
) -> None:
    fields = {k: v for k, v in model.model_fields.items() if k not in left_out}
    assert list(table) == list(fields)  # the same names, in the model's order
    for name, info in fields.items():
        f = table[name]
        kind, optional, choices = _kind(info.annotation)
        assert (f.kind, f.optional, f.choices) == (kind, optional, choices), name
        if info.is_required():
            assert f.default is plain.REQUIRED, name
        else:
            assert f.default == info.get_default(call_default_factory=True), name
        expected = {"low": -plain.INF, "high": plain.INF, "low_open": False, "high_open": False}
        expected |= {"min_len": 0, "max_len": None} | _bounds(info.metadata)
        assert {k: getattr(f, k) for k in expected} == expected, name


BAD = object()  # in each pool: valid values before it, invalid ones after
POOL: dict[str, list[Any]] = {
    "stack": ["hf", "unsloth", "torchtune", "torchtitan", "deepspeed", BAD, "nope", None, 1],
    "method": ["full", "lora", "qlora", BAD, "LORA", None],
    "lora_rank": [16, 1, 65536, BAD, 0, 65537, "16", 16.0, True, None],
    "lora_alpha": [None, 32, 32.0, 1e6, BAD, 0, -1, 1e7, "32", float("nan")],
    "lora_dropout": [None, 0, 0.05, 0.999, BAD, 1, -0.1, True],
    "lora_targets": [["all-linear"], ["q_proj", " v_proj "], BAD, [" "], [], ["a"] * 65, "q", [1]],
    "adapter_dtype": ["fp32", "bf16", BAD, "fp16"],
    "optimizer": ["adamw", "adamw-8bit", "sgd", "lion", BAD, "adam"],
    "precision": ["mixed", "bf16", "fp32", BAD, "fp16"],
    "checkpointing": ["none", "gpu", "offload", "selective", BAD, "all"],
    "loss": ["full", "chunked", "liger", "cce", "unsloth", BAD, None],
    "loss_chunk": [None, 1, 4096, BAD, 0, 10**10],
    "batch": [1, 2, 1_000_000, BAD, 0, 1_000_001, 2.0, "2"],
    "grad_accum": [None, 1, 4, BAD, 0],
    "autocast": [None, True, False, BAD, 1, "yes"],
    "optimizer_impl": [None, "fused", "foreach", "in-backward", BAD, "x"],
    "paged": [None, True, False],
    "double_quant": [None, True, False, BAD, 0],
    "train_embeddings": [None, True, False],
    "base": [None, "bf16", "int8", "nf4", BAD, "fp8"],
    "kbit_prepare": [None, True, False],
    "compile": [None, True, False],
    "sharding": ["none", "fsdp", "zero1", "zero3", "device_map", BAD, "ddp"],
    "num_gpus": [1, 2, 8, BAD, 0, 100_001],
    "attention": ["sdpa", "flash", "eager", BAD, "xformers"],
    "parallel": [None, "", "auto", "fsdp", "fsdp=2", "tp=2", "fsdp,pp=2", BAD, "zz", "x" * 201],
    "fsdp_wrap": ["layer", "block-2", "layer+embeddings+lm_head", BAD, "nope", "x" * 61],
    "reshard_after_forward": [True, False, BAD, "true", None],
    "offload": ["none", "optimizer", "params", BAD, "cpu"],
    "pp_schedule": ["1f1b", "gpipe", "interleaved-1f1b", BAD, "x"],
    "pp_virtual": [None, 2, BAD, 0, 1025],
}
REQUEST_POOL: dict[str, list[Any]] = {
    "model": [
        {"preset": "llama-3.1-8b"},
        {"preset": "qwen3-8b", "name": "mine"},
        {"preset": ""},
        {"params": 8e9},
        {"params": 8_000_000_000, "hidden": 4096, "layers": 32},
        {"params": 0.5},
        {"config": {"model_type": "llama"}},
        BAD,
        {"config": {1: 2}},
        {"preset": "x", "params": 1e9},
        {"hub": "org/name"},
        {},
        "llama",
    ],
    "seq_lens": [[4096], [1024, 8192], BAD, [], [0], [100_000_001], [4096.0], ["4096"]],
    "gpus": [["h100-80gb"], ["h200", "2xh200"], BAD, [], "h200", [1]],
    "usable_fraction": [0.92, 1, 1.0, BAD, 0, 1.5, "0.9"],
    "profile": ["default", "seed-000", BAD, "", "x" * 201],
    "tokens": [None, 1e9, 10**9, BAD, 0, 1e17],
    "target_tokens": [None, "chinchilla", BAD, "gopher"],
    "dataset_lengths": [None, [100, 2000], BAD, [], [1.5]],
    "epochs": [1.0, 2, BAD, 0, 1e7],
    "overflow": ["drop", "truncate", BAD, "keep"],
    "prices": [{}, {"h200": 3.5}, {"h200": 3}, BAD, {"h200": -1}, {"h200": 10_001}, {"h200": "3"}],
}


def _pick(rng: random.Random, values: list[Any]) -> Any:
    """A valid value nine times in ten, else an invalid one."""
    cut = values.index(BAD) if BAD in values else len(values)
    good, bad = values[:cut], values[cut + 1 :]
    return rng.choice(bad) if bad and rng.random() < 0.1 else rng.choice(good)


def _body(rng: random.Random) -> dict[str, Any]:
    setup = {name: _pick(rng, v) for name, v in POOL.items() if rng.random() < 0.25}
    body: dict[str, Any] = {"model": _pick(rng, REQUEST_POOL["model"]), "setup": setup}
    for name, values in list(REQUEST_POOL.items())[1:]:
        if rng.random() < 0.3:
            body[name] = _pick(rng, values)
    if rng.random() < 0.03:
        body["extra"] = 1
    return body


def _typed(d: dict[str, Any]) -> list[tuple[str, Any, type]]:
    return [(k, v, type(v)) for k, v in d.items()]


def test_plain_requests_are_the_pydantic_requests_or_defer() -> None:
    rng = random.Random(17)
    plain_ok = 0
    for _ in range(4000):
        body = _body(rng)
        try:
            ours = plain._plain_request(body)
        except plain._Defer:
            ours = None
        try:
            theirs = EstimateRequest.model_validate(body)
        except (ValidationError, ValueError):
            assert ours is None, body  # never a plain request that pydantic refuses
            continue
        if ours is None:
            continue
        plain_ok += 1
        assert _typed(ours.setup.model_dump()) == _typed(theirs.setup.model_dump()), body
        assert list(ours.setup.__dict__) == list(theirs.setup.__dict__), body  # setup_key
        assert ours.setup.model_fields_set == theirs.setup.model_fields_set, body
        assert ours.setup.is_adapter == theirs.setup.is_adapter
        for name in ModelInput.model_fields:
            assert getattr(ours.model, name) == getattr(theirs.model, name), (name, body)
        for name in plain.REQUEST_FIELDS:
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a, type(a)) == (b, type(b)), (name, body)
        assert (ours.calibration, ours.train_config_report) == (None, None)
    assert plain_ok > 400  # the comparison covered many accepted bodies (549 with seed 17)


def test_plain_setup_copies_as_the_pydantic_model_does() -> None:
    data = {"method": "lora", "lora_targets": ["q_proj", "v_proj"], "num_gpus": 2}
    ours, theirs = plain.plain_setup(dict(data)), TrainingSetup.model_validate(dict(data))
    for kwargs in ({}, {"deep": True}, {"update": {"batch": 4, "parallel": None}}):
        a, b = ours.model_copy(**kwargs), theirs.model_copy(**kwargs)
        assert a.model_dump() == b.model_dump() and a.model_fields_set == b.model_fields_set
        deep = kwargs.get("deep", False)
        assert (a.lora_targets is ours.lora_targets) == (not deep)
        assert (b.lora_targets is theirs.lora_targets) == (not deep)
    ours.batch = 3  # setting a field marks it set, as pydantic does
    theirs.batch = 3
    assert ours.model_fields_set == theirs.model_fields_set
    assert ours.model_dump()["lora_targets"] is not ours.lora_targets


def test_a_value_pydantic_would_coerce_or_refuse_goes_to_pydantic() -> None:
    coerced = plain.estimate_request({"model": {"preset": "llama-3.1-8b"}, "seq_lens": [4096.0]})
    assert isinstance(coerced, EstimateRequest)  # pydantic's lax int, not a plain request
    with pytest.raises(ValidationError, match="lora_rank"):
        plain.estimate_request({"model": {"preset": "x"}, "setup": {"lora_rank": 0}})
    with pytest.raises(ValidationError, match="base: qlora quantizes"):
        plain.estimate_request(
            {"model": {"preset": "x"}, "setup": {"method": "qlora", "base": "bf16"}}
        )
    easy = plain.estimate_request({"model": {"preset": "llama-3.1-8b"}, "gpus": ["h200"]})
    assert isinstance(easy, plain.PlainEstimateRequest)


GPU_POOL = ["h200", "2xh200", "16gib", BAD, "", "x" * 65, 1, ["h200"]]


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except (ValidationError, ValueError) as err:
        return "error", str(err)


def test_plain_check_requests_are_the_pydantic_ones_or_defer() -> None:
    rng = random.Random(18)
    plain_ok = 0
    for _ in range(2000):
        base = _body(rng)
        body = {k: v for k, v in base.items() if k in ("model", "setup", "seq_lens", "profile")}
        if rng.random() < 0.9:  # else a body without the required seq_lens
            body.setdefault("seq_lens", [4096])
        body["gpu"] = _pick(rng, GPU_POOL)
        if "usable_fraction" in base:
            body["usable_fraction"] = base["usable_fraction"]
        try:
            ours = plain._plain_check(body)
        except plain._Defer:
            ours = None
        try:
            theirs = CheckRequest.model_validate(body)
        except (ValidationError, ValueError):
            assert ours is None, body
            continue
        if ours is None:
            continue
        plain_ok += 1
        assert _typed(ours.setup.model_dump()) == _typed(theirs.setup.model_dump()), body
        assert ours.setup.model_fields_set == theirs.setup.model_fields_set, body
        for name in plain.CHECK_FIELDS:
            a, b = getattr(ours, name), getattr(theirs, name)
            assert (a, type(a)) == (b, type(b)), (name, body)
        kind, est = _outcome(ours.as_estimate_request)
        their_kind, their_est = _outcome(theirs.as_estimate_request)
        assert kind == their_kind == "ok", body  # out-of-range lengths deferred above
        for name in plain.REQUEST_FIELDS:
            a, b = getattr(est, name), getattr(their_est, name)
            assert (a, type(a)) == (b, type(b)), (name, body)
        assert est.setup is ours.setup and their_est.setup is theirs.setup
    assert plain_ok > 200  # 311 with seed 18
