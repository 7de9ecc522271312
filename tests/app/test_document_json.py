"""`app/document_json.encode` writes the bytes `json.dumps` wrote for an estimate document
(what `/v1/estimate` answered before, issue 17): every document of the speed corpus
(bench/doc_corpus.py), floats of every magnitude, the numbers the two serialisers write
differently, markers inside strings, and NaN/Infinity refused as json refuses them."""

from __future__ import annotations

import enum
import math
import random
import re
import struct
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.document_json import encode, reference
from bench import doc_corpus
from estimator.document import estimate_document
from estimator.errors import EstimatorInputError
from estimator.request import EstimateRequest


def _same(doc: Any) -> None:
    assert encode(doc) == reference(doc)


@pytest.mark.slow
def test_every_corpus_document_is_encoded_byte_for_byte_as_json_dumps() -> None:
    checked = rewritten = 0
    for name, body, variants in doc_corpus._cases():
        try:
            doc = estimate_document(EstimateRequest.model_validate(body), variants)
        except (EstimatorInputError, ValueError):
            continue
        expected = reference(doc)
        assert encode(doc) == expected, name
        checked += 1
        rewritten += re.search(rb"\de-0[5-9]", expected) is not None
    assert checked > 500
    assert rewritten > 100  # the corpus does carry the numbers written differently


# where pydantic-core writes otherwise (1e-9 <= |x| < 1e-4), the edges of that range, and
# the edges of Python's own switch to exponents (1e16, 1e-4)
EDGE_FLOATS = [
    1e-4,
    9.999999999999999e-05,
    1e-05,
    2.5e-05,
    6.623823703554898e-05,
    9.99999e-06,
    1e-07,
    1e-09,
    9.999999999999999e-10,
    1e-10,
    5e-324,
    2.2250738585072014e-308,
    0.0,
    -0.0,
    1.0,
    0.1,
    0.30000000000000004,
    1e15,
    1e16,
    1.5e16,
    123456789012345680.0,
    1e21,
    1e22,
    1.7976931348623157e308,
    3.0e-5,
    7e-9,
]


@pytest.mark.parametrize("x", EDGE_FLOATS + [-x for x in EDGE_FLOATS])
def test_edge_floats_are_written_as_python_writes_them(x: float) -> None:
    _same(x)
    _same([x])
    _same({"a": x, "b": [1, x, {"c": x}], "d": "text"})


def _random_doubles(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    while len(out) < n:
        if len(out) % 2:  # any bit pattern
            x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        else:  # a decimal of a few digits, every exponent
            x = float(f"{rng.randint(1, 10 ** rng.randint(1, 17))}e{rng.randint(-330, 300)}")
        if math.isfinite(x):
            out.append(x)
    return out


def test_random_doubles_of_every_magnitude_are_written_alike() -> None:
    values = _random_doubles(40_000, seed=17)
    _same(values)
    _same({f"k{i}": [x, -x] for i, x in enumerate(values[:5000])})


def test_a_document_without_small_numbers_is_the_serialiser_s_own_output() -> None:
    doc = {"a": [1.5, 2e20, None, True, False, 10**30, -(10**30)], "b": {"c": "d"}, "e": []}
    _same(doc)


MARKER_TEXT = [
    "0.00001",
    ":0.00001,",
    "x:1e-7,y",
    "[1e-5]",
    "NaN",
    "-Infinity",
    "fine-tune e-5 0.0000",
]


@pytest.mark.parametrize("text", MARKER_TEXT)
def test_markers_inside_strings_stay_text(text: str) -> None:
    for doc in (
        {"note": text, "x": 2.5e-05},
        {text: 1e-07, "y": [text, 3e-05]},
        {"x": 1e-06, "note": text + ' "quoted" \\ back\nslash'},  # escapes: json.dumps path
        [text, text],
    ):
        _same(doc)


def test_strings_and_escapes_are_written_alike() -> None:
    text = '\\"\b\f\n\r\t\x00\x01\x1f\x7f\u2028\u2029\ufeff é 中 \U0001f600 </script>'
    _same({"t": text, text: [text], "n": 1e-05})
    _same({"t": text})


class _Kind(enum.StrEnum):
    LORA = "lora"


class _Count(enum.IntEnum):
    THREE = 3


def test_plain_types_and_their_subclasses_are_written_alike() -> None:
    doc = {
        "tuple": (1, (2.5e-05, "a")),
        "int_keys": {1: "one", 2: 2},
        "bool_key": {True: 1},
        "enum": [_Kind.LORA, _Count.THREE],
        "enum_key": {_Kind.LORA: 1},
        "big": 2**64 + 1,
        "numpy_float64": [np.float64(2.5e-05), np.float64(1e16), np.float64(-0.0)],
        "empty": [{}, [], ""],
    }
    _same(doc)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_as_json_refuses_them(bad: float) -> None:
    for doc in ({"x": bad}, [1.0, bad], {"a": {"b": [bad, 1e-05]}}, bad):
        with pytest.raises(ValueError):
            reference(doc)
        with pytest.raises(ValueError, match="not JSON compliant"):
            encode(doc)
    # as text they are only text
    _same({"note": "NaN Infinity -Infinity", "x": 1e-05})


BODY = {
    "model": {"preset": "llama-3.1-8b"},
    "setup": {"method": "lora"},
    "seq_lens": [1024, 4096, 32768],
    "gpus": ["h100-80gb", "rtx-4090", "2xh200"],
}


def test_the_estimate_route_answers_the_bytes_json_dumps_wrote(
    sqlite_client: TestClient,
) -> None:
    response = sqlite_client.post("/v1/estimate", json=BODY)
    assert response.status_code == 200
    expected = reference(estimate_document(EstimateRequest.model_validate(BODY)))
    assert response.content == expected
    assert response.headers["content-length"] == str(len(expected))
    assert response.headers["content-type"] == "application/json"
