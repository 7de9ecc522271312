"""Memoisation of what does not depend on the sequence length: results computed from a
`ModelSpec` and a `Profile` (frozen, shared: `estimator.model_source` caches specs by content,
`load_profile` profiles by name) and a `TrainingSetup` (a mutable pydantic model, so keyed by
its field values, `setup_key`).

A `Memo` keys an entry by the identity of its anchor objects plus a value key, and holds the
anchors themselves, so an id cannot be reused by another object while its entry lives. The
memoised values are shared between callers: they must be immutable or treated as such."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def setup_key(setup: Any) -> tuple[Any, ...]:
    """A hashable key of a `TrainingSetup`'s field values (lists become tuples)."""
    values = dict(setup.__dict__)
    targets = values.get("lora_targets")
    if type(targets) is list:  # the one list field, made a tuple without a loop over all
        values["lora_targets"] = tuple(targets)
    key = tuple(values.values())
    try:
        hash(key)
    except TypeError:  # another list field
        return tuple(tuple(v) if type(v) is list else v for v in values.values())
    return key


class Memo(Generic[T]):
    """At most `size` entries, the oldest dropped first."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[tuple[object, ...], T]] = OrderedDict()

    def get(self, anchors: tuple[object, ...], key: Hashable, build: Callable[[], T]) -> T:
        full = (tuple(map(id, anchors)), key)
        hit = self._entries.get(full)
        if hit is not None:
            return hit[1]
        value = build()  # bad input raises here and is not memoised
        self._entries[full] = (anchors, value)
        while len(self._entries) > self.size:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # another thread emptied it
                break
        return value

    def clear(self) -> None:
        self._entries.clear()
