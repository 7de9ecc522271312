"""Memoisation of what does not depend on the sequence length: results computed from a
`ModelSpec` and a `Profile` (frozen, shared: `estimator.model_source` caches specs by content,
`load_profile` profiles by name) and a `TrainingSetup` (a mutable pydantic model, so keyed by
its field values, `setup_key`). `setup_key` interns its keys: equal setups get the same
tuple, so a memo can take the key as an anchor (its identity) rather than hash and compare
its ~30 values at every lookup (issue 17: ~0.5 us a lookup, several per estimate).

A `Memo` keys an entry by the identity of its anchor objects plus a value key, and holds the
anchors themselves, so an id cannot be reused by another object while its entry lives. The
memoised values are shared between callers: they must be immutable or treated as such."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import suppress
from typing import Any, Generic, TypeVar, TypeVarTuple

T = TypeVar("T")
Args = TypeVarTuple("Args")


# the interned setup keys (`setup_key`), at most INTERNED_KEYS, the oldest dropped first
INTERNED_KEYS = 4096
_INTERNED: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def setup_key(setup: Any) -> tuple[Any, ...]:
    """A key of a `TrainingSetup`'s field values (its one list field made a tuple, any other
    list or dict frozen), interned: the same tuple object for equal values while it is kept.
    A dropped key's setups get a new tuple, equal to it but another anchor (a memo miss, never
    another setup's entry: an entry holds its anchors, so their ids are not reused)."""
    values = dict(setup.__dict__)
    targets = values.get("lora_targets")
    if type(targets) is list:
        values["lora_targets"] = tuple(targets)
    key = tuple(values.values())
    try:
        interned = _INTERNED.setdefault(key, key)
    except TypeError:  # a list or dict in another field
        key = _frozen(key)
        interned = _INTERNED.setdefault(key, key)
    if interned is key and len(_INTERNED) > INTERNED_KEYS:
        _drop_oldest_key()
    return interned


def _drop_oldest_key() -> None:
    with suppress(KeyError, RuntimeError, StopIteration):  # another thread changed it meanwhile
        del _INTERNED[next(iter(_INTERNED))]


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

    def call(
        self,
        anchors: tuple[object, ...],
        key: Hashable,
        build: Callable[[*Args], T],
        *args: *Args,
    ) -> T:
        """The value for (anchors, key), `build(*args)` on a miss: the builder's arguments are
        passed, not captured in a closure made per lookup (issue 17: a partial or a lambda was a
        tenth of a lookup's cost)."""
        full = (tuple(map(id, anchors)), key)
        try:
            hit = self._entries.get(full)
        except TypeError:  # a list or dict in the key
            full = (full[0], _frozen(key))
            hit = self._entries.get(full)
        if hit is not None:
            return hit[1]
        value = build(*args)  # bad input raises here and is not memoised
        self._entries[full] = (anchors, value)
        while len(self._entries) > self.size:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # another thread emptied it
                break
        return value

    def get(self, anchors: tuple[object, ...], key: Hashable, build: Callable[[], T]) -> T:
        """`call` of a builder that takes no arguments."""
        return self.call(anchors, key, build)

    def clear(self) -> None:
        self._entries.clear()
