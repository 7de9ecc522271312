"""estimator.dict_display: the dict displays it compiles equal the dicts built key by key, for
any str keys (quotes, backslashes, newlines included), fresh at every level on every call, and
it refuses keys that are not exact str."""

from __future__ import annotations

import pytest

from estimator.dict_display import nested_dict, row_dict

AWKWARD = ("weights", "it's", 'say "x"', "back\\slash", "new\nline", "})); import os #")


def test_row_dict_equals_dict_zip_for_awkward_str_keys() -> None:
    row = list(range(len(AWKWARD)))
    assert row_dict(AWKWARD)(row) == dict(zip(AWKWARD, row, strict=True))


def test_nested_dict_builds_every_level_fresh() -> None:
    shape = (("loss", (("weights", 0), ("it's", 1))), ("step", (("x", 2),)), ("top", 3))
    make = nested_dict(shape)
    row = [1.0, 2, None, "s"]
    first, second = make(row), make(row)
    assert first == {"loss": {"weights": 1.0, "it's": 2}, "step": {"x": None}, "top": "s"}
    assert first == second
    assert first is not second and first["loss"] is not second["loss"]
    assert list(first) == ["loss", "step", "top"]  # the shape's key order


def test_dict_displays_refuse_keys_that_are_not_str_and_bad_slots() -> None:
    class Sneaky(str):
        def __repr__(self) -> str:
            return "__import__('os')"

    with pytest.raises(TypeError):
        row_dict(("weights", Sneaky("x")))
    with pytest.raises(TypeError):
        row_dict((1,))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        nested_dict((("a", "row[0]"),))  # type: ignore[arg-type]
