"""`--parallel` texts: parsing, resolution against the GPU count, and the model checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from estimator.architectures import spec_from_config
from estimator.errors import EstimatorInputError
from estimator.parallel import check_model, parse_parallel, parse_wrap, resolve
from estimator.parallel.layout import parse_wrap_units
from estimator.presets import preset_config
from estimator.setup import TrainingSetup

LLAMA70B = spec_from_config(preset_config("llama-3.1-70b"))


@pytest.mark.parametrize(
    ("text", "gpus", "expected"),
    [
        ("fsdp=8,tp=8", 64, "fsdp=8,tp=8"),
        ("fsdp,tp=8", 16, "fsdp=2,tp=8"),
        ("zero3", 8, "zero3=8"),
        ("dp", 4, "dp=4"),
        ("ddp=2", 2, "dp=2"),
        ("hsdp", 16, "dp=2,fsdp=8"),
        ("fsdp=4,dp", 16, "dp=4,fsdp=4"),
        ("tp=4,sp,pp=2", 8, "tp=4,pp=2,sp"),
        ("cp=4,fsdp", 16, "fsdp=4,cp=4"),
    ],
)
def test_a_layout_resolves_to_degrees_that_multiply_to_the_gpus(text, gpus, expected) -> None:
    layout = resolve(parse_parallel(text), gpus, 8)
    assert layout.text == expected
    assert layout.gpus == gpus


@pytest.mark.parametrize(
    ("text", "gpus", "words"),
    [
        ("fsdp=8,tp=8", 16, "multiply to 64"),
        ("tp=3", 8, "multiply to 3"),
        ("fsdp,tp=3", 16, "not a multiple"),
    ],
)
def test_a_product_other_than_the_gpu_count_names_the_field(text, gpus, words) -> None:
    with pytest.raises(EstimatorInputError) as err:
        resolve(parse_parallel(text), gpus, 8)
    assert err.value.field == "setup.parallel" and words in err.value.message


@pytest.mark.parametrize(
    "text", ["fsdp,zero3", "tp", "sp", "dp,zero2", "xp=2", "tp=0", "fsdp=8,fsdp=8", "hsdp,dp"]
)
def test_malformed_layouts_are_rejected_by_the_setup(text) -> None:
    with pytest.raises(ValidationError) as err:
        TrainingSetup(parallel=text)
    assert "setup.parallel" in str(err.value)


def test_tp_must_divide_the_heads_and_pp_must_not_exceed_the_layers() -> None:
    with pytest.raises(EstimatorInputError, match="does not divide the 64 attention heads"):
        check_model(resolve(parse_parallel("tp=3"), 3), LLAMA70B)
    with pytest.raises(EstimatorInputError, match="pp=96 stages but"):
        check_model(resolve(parse_parallel("pp=96"), 96), LLAMA70B)
    with pytest.raises(EstimatorInputError, match="no routed experts"):
        check_model(resolve(parse_parallel("ep=2,dp"), 2), LLAMA70B)
    check_model(resolve(parse_parallel("tp=8,pp=4"), 32), LLAMA70B)  # fine


def test_fsdp_wrap_is_layer_or_block_of_n() -> None:
    assert parse_wrap("layer") == 1 and parse_wrap("block-of-4") == 4
    with pytest.raises(EstimatorInputError):
        parse_wrap("module")


def test_fsdp_wrap_names_modules_wrapped_as_units_of_their_own() -> None:
    assert parse_wrap_units("layer") == (1, ())
    # torchtune's custom_sharded_layers names, in any order, map to the canonical ones
    assert parse_wrap_units("layer+output+tok_embeddings") == (1, ("embeddings", "lm_head"))
    assert parse_wrap_units("block-of-2+lm_head") == (2, ("lm_head",))
    with pytest.raises(EstimatorInputError, match="not a module to wrap") as info:
        parse_wrap_units("layer+norm")
    assert info.value.field == "setup.fsdp_wrap"
    with pytest.raises(EstimatorInputError, match="given twice"):
        parse_wrap_units("layer+output+lm_head")
