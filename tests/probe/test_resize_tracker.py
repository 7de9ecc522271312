"""probe.torchtitan_fake.ResizeTracker: the storage tracker plus storage resizes (FSDP2 frees and
re-allocates its unsharded parameters with `untyped_storage().resize_()`, no dispatched op) and
tensor subclasses counted by their inner tensors. Needs torch only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probe.torchtitan_fake import ResizeTracker  # noqa: E402
from probe.tracker import GRANULARITY  # noqa: E402


def test_storage_resizes_are_counted_like_allocations_and_frees() -> None:
    with ResizeTracker() as tracker:
        t = torch.empty(1000, dtype=torch.float32)  # 4000 B -> 4096 B in 512 B blocks
        assert tracker.current == 4096
        t.untyped_storage().resize_(0)  # FSDP2 free_storage
        assert tracker.current == 0
        t.untyped_storage().resize_(10_000)  # alloc_storage, a new size
        assert tracker.current == 10_240
        assert tracker.peak == 10_240
        del t
    assert tracker.current == 0


def test_a_storage_first_seen_through_a_resize_is_counted_and_freed() -> None:
    t = torch.empty(0)
    with ResizeTracker() as tracker:
        t.untyped_storage().resize_(3 * GRANULARITY + 1)
        assert tracker.current == 4 * GRANULARITY
        del t
        assert tracker.current == 0


def test_resize_is_restored_after_the_tracker() -> None:
    original = torch.UntypedStorage.resize_
    with ResizeTracker():
        assert torch.UntypedStorage.resize_ is not original
    assert torch.UntypedStorage.resize_ is original


def test_fake_tensors_are_counted_as_real_ones() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), ResizeTracker() as tracker:
        a = torch.empty(1024, 256, dtype=torch.bfloat16)
        b = a.float()
        assert tracker.current == 512 * 1024 + 1024 * 1024
        a.untyped_storage().resize_(0)
        assert tracker.current == 1024 * 1024
        del b
    assert tracker.peak == 512 * 1024 + 1024 * 1024
