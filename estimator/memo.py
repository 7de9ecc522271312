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
    """A key of a `TrainingSetup`'s field values (its one list field made a tuple; `Memo.get`
    freezes any other list it meets)."""
    values = dict(setup.__dict__)
    targets = values.get("lora_targets")
    if type(targets) is list:
        values["lora_targets"] = tuple(targets)
    return tuple(values.values())


def _frozen(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    return value


class Memo(Generic[T]):
    """At most `size` entries, the oldest dropped first."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[tuple[object, ...], T]] = OrderedDict()

    def get(self, anchors: tuple[object, ...], key: Hashable, build: Callable[[], T]) -> T:
        full = (tuple(map(id, anchors)), key)
        try:
            hit = self._entries.get(full)
        except TypeError:  # a list or dict in the key
            full = (full[0], _frozen(key))
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
