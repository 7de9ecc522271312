"""bench/allocator_slack.py: the least device memory a trace runs in, worked out by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
slack = pytest.importorskip("bench.allocator_slack")

from probe.allocator import AllocatorConfig, MiB, replay  # noqa: E402
from probe.allocator_events import alloc, free  # noqa: E402


def test_a_freed_segment_too_small_for_the_next_request_is_released_when_memory_runs_out():
    # 600 MiB freed and cached; 700 MiB does not fit in it: a new segment on a roomy card
    # (reserved 1300), but with 800 MiB of device memory the allocator frees the cached
    # segment and retries, so the trace runs in the 700 MiB it needs at most (+ 2 MiB search).
    events = [alloc(1, 600 * MiB), free(1), alloc(2, 700 * MiB), free(2)]
    roomy = replay(events, AllocatorConfig(device_memory=4096 * MiB))
    assert roomy.peak_reserved == 1300 * MiB and roomy.peak_allocated == 700 * MiB
    need = slack.min_capacity(events, False, roomy.peak_allocated, roomy.peak_reserved)
    assert 700 * MiB <= need <= 702 * MiB
    assert replay(events, AllocatorConfig(device_memory=need)).oom_at_event is None


def test_a_split_segment_in_use_cannot_be_released():
    # a 6 MiB block takes a 20 MiB segment (14 MiB left free in it); a 16 MiB request does not
    # fit in the 14 and gets its own 16 MiB segment: 22 MiB allocated, 36 MiB reserved, and
    # since the first segment holds a live block it cannot be given back: 36 MiB are needed
    events = [alloc(1, 6 * MiB), alloc(2, 16 * MiB), free(2), free(1)]
    roomy = replay(events, AllocatorConfig(device_memory=4096 * MiB))
    assert roomy.peak_allocated == 22 * MiB and roomy.peak_reserved == 36 * MiB
    need = slack.min_capacity(events, False, roomy.peak_allocated, roomy.peak_reserved + MiB)
    assert 36 * MiB <= need <= 38 * MiB
    assert replay(events, AllocatorConfig(capacity=34 * MiB)).oom_at_event == 1
