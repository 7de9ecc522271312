"""`estimator.memo.setup_key` interns its keys (issue 17): equal setups share one tuple, which
memos take as an anchor (by identity); a dropped key never hands one setup another's entry."""

from __future__ import annotations

import pytest

from estimator import memo
from estimator.memo import Memo, setup_key
from estimator.setup import TrainingSetup


def test_equal_setups_share_one_key_and_others_do_not() -> None:
    a = TrainingSetup(method="lora", lora_targets=["q_proj", "v_proj"])
    b = TrainingSetup(method="lora", lora_targets=["q_proj", "v_proj"])
    c = TrainingSetup(method="lora", lora_targets=["q_proj"])
    assert setup_key(a) is setup_key(b)
    assert setup_key(a) == tuple(
        tuple(v) if isinstance(v, list) else v for v in a.__dict__.values()
    )
    assert setup_key(c) != setup_key(a)
    assert setup_key(c) is not setup_key(a)


def test_a_mutated_setup_gets_its_new_values_key() -> None:
    s = TrainingSetup(method="lora")
    before = setup_key(s)
    s.lora_rank = 64
    after = setup_key(s)
    assert after is not before
    assert after == setup_key(TrainingSetup(method="lora", lora_rank=64))


def test_unhashable_field_values_are_frozen() -> None:
    s = TrainingSetup(method="lora")
    s.__dict__["parallel"] = {"tp": [2]}  # not a value the schema allows; still a key
    key = setup_key(s)
    hash(key)
    assert setup_key(s) is key


def test_the_table_is_bounded_and_a_dropped_key_only_misses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memo, "INTERNED_KEYS", 4)
    monkeypatch.setattr(memo, "_INTERNED", {})
    first = TrainingSetup(method="lora", lora_rank=1)
    old = setup_key(first)
    for rank in range(2, 10):
        setup_key(TrainingSetup(method="lora", lora_rank=rank))
    assert len(memo._INTERNED) <= 4
    new = setup_key(first)
    assert new == old and new is not old  # dropped: a new anchor, equal values
    m: Memo[int] = Memo()
    assert m.get((old,), None, lambda: 1) == 1
    assert m.get((new,), None, lambda: 2) == 2  # a miss, not the other anchor's entry
    assert m.get((old,), None, lambda: 3) == 1  # the old entry holds its anchor alive


def test_memo_call_builds_once_from_its_arguments() -> None:
    m: Memo[tuple[int, str]] = Memo()
    anchor = object()
    built: list[tuple[int, str]] = []

    def build(n: int, s: str) -> tuple[int, str]:
        built.append((n, s))
        return n, s

    assert m.call((anchor,), ("k",), build, 1, "a") == (1, "a")
    assert m.call((anchor,), ("k",), build, 2, "b") == (1, "a")  # a hit: not rebuilt
    assert m.call((anchor,), ["unhashable"], build, 3, "c") == (3, "c")  # frozen key
    assert m.call((anchor,), ["unhashable"], build, 4, "d") == (3, "c")
    assert built == [(1, "a"), (3, "c")]
    assert m.get((anchor,), None, lambda: (5, "e")) == (5, "e")
    assert m.get((anchor,), None, lambda: (6, "f")) == (5, "e")
