"""estimator.rows._row_dict: the dict display it compiles equals dict(zip(keys, row)) for any
str keys (quotes, backslashes, newlines included) and refuses keys that are not exact str."""

from __future__ import annotations

import pytest

from estimator.rows import _row_dict


def test_row_dict_equals_dict_zip_for_awkward_str_keys() -> None:
    keys = ("weights", "it's", 'say "x"', "back\\slash", "new\nline", "})); import os #")
    row = list(range(len(keys)))
    assert _row_dict(keys)(row) == dict(zip(keys, row, strict=True))


def test_row_dict_refuses_keys_that_are_not_str() -> None:
    class Sneaky(str):
        def __repr__(self) -> str:
            return "__import__('os')"

    with pytest.raises(TypeError):
        _row_dict(("weights", Sneaky("x")))
    with pytest.raises(TypeError):
        _row_dict((1,))  # type: ignore[arg-type]
