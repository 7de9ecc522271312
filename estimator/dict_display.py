"""Dicts of a fixed shape built by one compiled dict display instead of a loop of inserts or a
`dict(zip(...))`: Python builds a display ~3x faster, and the estimate document is mostly such
dicts (issue 17: the memory rows' components and phases, the assumptions).

    make = row_dict(("weights", "logits"))          # lambda row: {"weights": row[0], ...}
    make = nested_dict((("loss", (("weights", 0), ("logits", 1))),))
    make([1.0, 2.0])                                # {"loss": {"weights": 1.0, "logits": 2.0}}

Each key is written as its `repr`, a string literal: only exact `str` keys are accepted. The
builders are cached by shape (a few fixed shapes per model and profile)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

# a nested dict's shape: (key, slot) pairs, a slot being the index of its value in the row
# or the shape of a dict one level down
Shape = tuple[tuple[str, "int | Shape"], ...]


def _key(key: object) -> str:
    if type(key) is not str:  # repr of an exact str is a string literal; nothing else is
        raise TypeError(f"dict display keys must be str, got {key!r}")
    return repr(key)


def _display(shape: Shape) -> str:
    items = []
    for key, slot in shape:
        if type(slot) is int:
            items.append(f"{_key(key)}: row[{slot}]")
        elif type(slot) is tuple:
            items.append(f"{_key(key)}: {_display(slot)}")
        else:
            raise TypeError(f"a slot is an int or a shape, got {slot!r}")
    return "{" + ", ".join(items) + "}"


@cache
def nested_dict(shape: Shape) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """`lambda row: {...}`: the dicts of `shape`, each leaf `row[slot]`; a fresh dict at every
    level on every call (the values themselves are the row's)."""
    make: Callable[[Sequence[Any]], dict[str, Any]] = eval(f"lambda row: {_display(shape)}")
    return make


@cache
def row_dict(keys: tuple[str, ...]) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """`lambda row: dict(zip(keys, row, strict=True))` for rows of `len(keys)` values."""
    return nested_dict(tuple((key, i) for i, key in enumerate(keys)))
