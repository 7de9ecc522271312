"""The caching-allocator simulation on hand-made traces whose peaks are worked out by hand.

Rules used in the derivations (probe/allocator.py docstring names the source of each):
round to 512 B; <= 1 MiB -> small pool; new segment = 2 MiB (small), 20 MiB (large, < 10 MiB),
else the request rounded up to 2 MiB; best fit; split if the rest is >= 512 B (small pool or
expandable) or > 1 MiB (large pool); free neighbours merge; expandable segments map 2 MiB pages
(small pool) or 20 MiB pages (large pool).
"""

from __future__ import annotations

import pytest

from probe.allocator import (
    AllocatorConfig,
    CachingAllocatorSim,
    MiB,
    SimulatedOOM,
    replay,
)
from probe.allocator_events import TraceError, alloc, free

KiB = 1024
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def test_small_allocations_share_one_2mib_segment() -> None:
    # 1000 B -> 1024 B; 100 KiB and 300 KiB are multiples of 512. All <= 1 MiB: small pool.
    # The first request opens a 2 MiB segment and is split off its front; the others are best
    # fits in the remainder. allocated = 1024 + 100 KiB + 300 KiB, reserved = one 2 MiB segment.
    res = replay([alloc(1, 1000), alloc(2, 100 * KiB), alloc(3, 300 * KiB)])
    assert res.peak_allocated == 1024 + 100 * KiB + 300 * KiB
    assert res.peak_reserved == 2 * MiB
    assert res.peak_segments == 1


def test_small_pool_splits_down_to_512_bytes() -> None:
    # 1 MiB is still small: a 2 MiB segment, split, 1 MiB left. 1 MiB - 512 takes it and leaves
    # 512 B, which is >= kMinBlockSize so it is split off; a 512 B request then fills it exactly.
    # allocated = 2 MiB = reserved, nothing cached.
    res = replay([alloc("a", MiB), alloc("b", MiB - 512), alloc("c", 512)])
    assert res.peak_allocated == 2 * MiB
    assert res.peak_reserved == 2 * MiB
    assert res.free_cached["free_bytes"] == 0


def test_5mib_allocation_takes_a_20mib_segment_and_shares_it() -> None:
    # 5 MiB: large pool, < 10 MiB -> a 20 MiB segment; the 15 MiB rest is > 1 MiB -> split.
    # A second 5 MiB request is a best fit in that rest: reserved stays 20 MiB.
    res = replay([alloc(1, 5 * MiB)])
    assert (res.peak_allocated, res.peak_reserved) == (5 * MiB, 20 * MiB)
    res = replay([alloc(1, 5 * MiB), alloc(2, 5 * MiB)])
    assert (res.peak_allocated, res.peak_reserved, res.peak_segments) == (10 * MiB, 20 * MiB, 1)


def test_30mib_allocation_is_its_own_2mib_rounded_segment() -> None:
    # 30 MiB >= 10 MiB: segment = 30 MiB rounded up to 2 MiB = 30 MiB, no rest.
    res = replay([alloc(1, 30 * MiB)])
    assert (res.peak_allocated, res.peak_reserved) == (30 * MiB, 30 * MiB)
    # 30 MiB + 1 B -> 30 MiB + 512 B; segment 32 MiB; rest 2 MiB - 512 B > 1 MiB -> split, so
    # only the 512-rounded block counts as allocated.
    res = replay([alloc(1, 30 * MiB + 1)])
    assert (res.peak_allocated, res.peak_reserved) == (30 * MiB + 512, 32 * MiB)


def test_large_pool_does_not_split_off_a_rest_of_1mib_or_less() -> None:
    # 11 MiB -> segment 12 MiB; rest 1 MiB is not > kSmallSize -> not split: the whole 12 MiB
    # block is handed out and counted as allocated (as max_memory_allocated would count it).
    res = replay([alloc(1, 11 * MiB)])
    assert (res.peak_allocated, res.peak_reserved) == (12 * MiB, 12 * MiB)


def test_fragmentation_free_holes_cannot_serve_a_larger_request() -> None:
    # Two 12 MiB tensors get two 12 MiB segments (24 MiB). Both are freed: two cached 12 MiB
    # holes, in different segments, so they cannot merge. A 24 MiB request fits neither ->
    # a third segment of 24 MiB. reserved peak 48 MiB, allocated peak 24 MiB.
    trace = [alloc(1, 12 * MiB), alloc(2, 12 * MiB), free(1), free(2), alloc(3, 24 * MiB)]
    res = replay(trace)
    assert res.peak_allocated == 24 * MiB
    assert res.peak_reserved == 48 * MiB
    assert res.slack == 24 * MiB
    assert res.fragmentation_at_peak == pytest.approx(0.5)  # 24 of 48 MiB allocated at the peak
    assert res.free_cached["free_bytes"] == 24 * MiB  # the two holes are still cached
    assert (res.small_pool_reserved_at_peak, res.small_pool_allocated_at_peak) == (0, 0)


def test_pool_shares_at_the_reserved_peak() -> None:
    # 300 KiB (small pool: one 2 MiB segment) and 5 MiB (large pool: one 20 MiB segment).
    # At the reserved peak (22 MiB) the small pool holds 2 MiB reserved, 300 KiB allocated.
    res = replay([alloc(1, 300 * KiB), alloc(2, 5 * MiB), free(1)])
    assert (res.peak_reserved, res.allocated_at_peak_reserved) == (22 * MiB, 300 * KiB + 5 * MiB)
    assert (res.small_pool_reserved_at_peak, res.small_pool_allocated_at_peak) == (
        2 * MiB,
        300 * KiB,
    )


def test_expandable_segments_reduce_reserved_in_the_fragmentation_case() -> None:
    # Same trace with expandable segments (large-pool pages of 20 MiB):
    #   alloc 1 (12 MiB): map one page [0, 20), block [0, 12), free rest [12, 20).
    #   alloc 2 (12 MiB): free [12, 20) + unmapped tail -> map one more page [20, 40):
    #                     block [12, 24), free [24, 40). reserved 40 MiB.
    #   free 1, free 2:   [0, 12) + [12, 24) + [24, 40) merge into one free 40 MiB block.
    #   alloc 3 (24 MiB): served from it, split -> no new page. reserved peak 40 MiB (< 48).
    trace = [alloc(1, 12 * MiB), alloc(2, 12 * MiB), free(1), free(2), alloc(3, 24 * MiB)]
    res = replay(trace, EXPANDABLE)
    assert res.peak_allocated == 24 * MiB
    assert res.peak_reserved == 40 * MiB
    assert res.peak_reserved < replay(trace).peak_reserved


def test_expandable_segment_grows_in_whole_pages() -> None:
    # Large pool: 30 MiB needs two 20 MiB pages -> 40 MiB reserved (one segment).
    res = replay([alloc(1, 30 * MiB)], EXPANDABLE)
    assert (res.peak_allocated, res.peak_reserved, res.peak_segments) == (30 * MiB, 40 * MiB, 1)
    # Small pool: 3 x 1 MiB need 3 MiB -> two 2 MiB pages, one segment.
    res = replay([alloc(i, MiB) for i in range(3)], EXPANDABLE)
    assert (res.peak_allocated, res.peak_reserved, res.peak_segments) == (3 * MiB, 4 * MiB, 1)


def test_freed_neighbours_coalesce_within_a_segment() -> None:
    # a (4 MiB) opens a 20 MiB segment: [a 0-4][free 4-20]. b (4 MiB) best-fits the rest:
    # [a][b 4-8][free 8-20]. free a: [free 0-4][b][free 8-20] (b blocks the merge).
    # free b: merges with both sides -> one free, unsplit 20 MiB block.
    # An 18 MiB request fits it: no new segment, reserved stays 20 MiB.
    sim = CachingAllocatorSim()
    sim.malloc("a", 4 * MiB)
    sim.malloc("b", 4 * MiB)
    sim.free("a")
    assert sim.free_cached()["largest_free_block"] == 12 * MiB
    sim.free("b")
    assert sim.free_cached() == {
        "free_bytes": 20 * MiB,
        "largest_free_block": 20 * MiB,
        "inactive_split_bytes": 0,
    }
    sim.malloc("c", 18 * MiB)
    assert (sim.stats.reserved, sim.stats.peak_reserved, sim.stats.segments) == (
        20 * MiB,
        20 * MiB,
        1,
    )


def test_empty_cache_releases_only_unsplit_segments() -> None:
    # Segment 1 (20 MiB) holds a live 5 MiB block and a free 15 MiB rest: split, kept.
    # Segment 2 (12 MiB) is free and whole: released. reserved 32 -> 20 MiB.
    sim = CachingAllocatorSim()
    sim.malloc(1, 5 * MiB)
    sim.malloc(2, 12 * MiB)
    sim.free(2)
    sim.empty_cache()
    assert (sim.stats.reserved, sim.stats.segments) == (20 * MiB, 1)
    assert sim.free_cached()["inactive_split_bytes"] == 15 * MiB


def test_empty_cache_unmaps_a_free_expandable_segment() -> None:
    # 24 MiB live in an expandable segment: 2 pages (40 MiB). Freed and emptied: both pages
    # are inside the free block -> unmapped, and the segment has nothing left -> released.
    sim = CachingAllocatorSim(EXPANDABLE)
    sim.malloc(1, 24 * MiB)
    assert sim.stats.reserved == 40 * MiB
    sim.free(1)
    sim.empty_cache()
    assert (sim.stats.reserved, sim.stats.segments) == (0, 0)


def test_oom_retry_frees_cached_segments_and_succeeds() -> None:
    # capacity 40 MiB. 30 MiB segment, freed (cached, reserved 30). A 32 MiB request: no free
    # block is large enough; cudaMalloc(32) fails (30 + 32 > 40); release_cached_blocks frees
    # the unsplit 30 MiB segment (reserved 0); the retry gets 32 MiB. reserved peak 32 MiB.
    trace = [alloc(1, 30 * MiB), free(1), alloc(2, 32 * MiB)]
    res = replay(trace, AllocatorConfig(capacity=40 * MiB))
    assert (res.ooms, res.alloc_retries, res.oom_at_event) == (0, 1, None)
    assert (res.peak_reserved, res.final_reserved) == (32 * MiB, 32 * MiB)
    # without a capacity the cache is kept and both segments stay reserved: 62 MiB
    assert replay(trace).peak_reserved == 62 * MiB


def test_oom_when_cached_memory_is_split_and_cannot_be_freed() -> None:
    # capacity 30 MiB. Two 5 MiB tensors share one 20 MiB segment; freeing one leaves the
    # segment split (the other is live), so the retry cannot release it: a 12 MiB request
    # (12 MiB segment, 20 + 12 > 30) is an OOM at event 3.
    trace = [alloc(1, 5 * MiB), alloc(2, 5 * MiB), free(1), alloc(3, 12 * MiB)]
    res = replay(trace, AllocatorConfig(capacity=30 * MiB))
    assert (res.ooms, res.oom_at_event, res.alloc_retries) == (1, 3, 1)
    assert res.final_reserved == 20 * MiB
    sim = CachingAllocatorSim(AllocatorConfig(capacity=30 * MiB))
    sim.malloc(1, 25 * MiB)
    with pytest.raises(SimulatedOOM):
        sim.malloc(2, 10 * MiB)  # a second segment of 10 MiB would need 36 MiB


def test_max_split_size_keeps_oversize_blocks_for_large_requests() -> None:
    # A cached 50 MiB block (unsplit). Default (no max_split_size): a 30 MiB request splits it,
    # reserved stays 50 MiB. With max_split_size 40 MiB the 50 MiB block is oversize and is not
    # given to a 30 MiB request: a new 30 MiB segment, reserved 80 MiB.
    trace = [alloc(1, 50 * MiB), free(1), alloc(2, 30 * MiB)]
    assert replay(trace).peak_reserved == 50 * MiB
    capped = AllocatorConfig(max_split_size=40 * MiB)
    assert replay(trace, capped).peak_reserved == 80 * MiB
    # A 45 MiB request (>= max_split_size) may take it, since 50 < 45 + 20 (the non-split
    # rounding limit); it is not split, so all 50 MiB count as allocated.
    res = replay([alloc(1, 50 * MiB), free(1), alloc(2, 45 * MiB)], capped)
    assert (res.peak_reserved, res.final_allocated) == (50 * MiB, 50 * MiB)
    # A 42 MiB request and a cached 70 MiB block: 70 >= 42 + 20 -> refused (too much rounding
    # up); a new 42 MiB segment: reserved 70 + 42 MiB.
    res = replay([alloc(1, 70 * MiB), free(1), alloc(2, 42 * MiB)], capped)
    assert res.peak_reserved == 112 * MiB
    assert replay([alloc(1, 70 * MiB), free(1), alloc(2, 42 * MiB)]).peak_reserved == 70 * MiB


def test_release_available_cached_blocks_frees_an_oversize_block_first() -> None:
    # max_split_size 40 MiB, capacity 100 MiB. A cached, unsplit 60 MiB block and a live 30 MiB
    # one (reserved 90). A 35 MiB request: the 60 MiB block is oversize -> not used;
    # cudaMalloc(36) fails (90 + 36 > 100); release_available_cached_blocks frees the 60 MiB
    # block (the smallest one >= max(35, 40) MiB); the retry succeeds: reserved 30 + 36 MiB.
    cfg = AllocatorConfig(max_split_size=40 * MiB, capacity=100 * MiB)
    res = replay([alloc(1, 60 * MiB), alloc(2, 30 * MiB), free(1), alloc(3, 35 * MiB)], cfg)
    assert (res.ooms, res.alloc_retries) == (0, 0)
    assert res.final_reserved == 66 * MiB
    assert res.peak_reserved == 90 * MiB


def test_zero_byte_allocations_take_no_block() -> None:
    res = replay([alloc(1, 0), free(1), alloc(2, 0)])
    assert (res.peak_allocated, res.peak_reserved, res.requests) == (0, 0, 0)


def test_reset_peak_restarts_the_peaks() -> None:
    from probe.allocator_events import Event

    trace = [alloc(1, 30 * MiB), free(1), Event("empty_cache"), Event("reset_peak"), alloc(2, MiB)]
    res = replay(trace)
    assert (res.peak_allocated, res.peak_reserved) == (MiB, 2 * MiB)


def test_roundup_power2_divisions() -> None:
    # round_size uses the divisions only above 512 B x divisions (2048 B for 4). 4200 B with 4
    # divisions: between 4096 and 8192 the steps are 5120, 6144, 7168 -> 5120 (plain 512-B
    # rounding: 4608). 1200 B stays on the 512-B rule -> 1536.
    sim = CachingAllocatorSim(AllocatorConfig(roundup_power2_divisions=4))
    assert sim.round_size(4200) == 5120
    assert sim.round_size(4096) == 4096
    assert sim.round_size(1200) == 1536
    assert CachingAllocatorSim().round_size(4200) == 4608


def test_bad_traces_and_settings_name_the_field() -> None:
    with pytest.raises(TraceError, match="free 7"):
        replay([free(7)])
    with pytest.raises(TraceError, match="already allocated"):
        replay([alloc(1, 10), alloc(1, 10)])
    with pytest.raises(ValueError, match="max_split_size"):
        AllocatorConfig(max_split_size=10 * MiB)
    with pytest.raises(ValueError, match="roundup_power2_divisions"):
        AllocatorConfig(roundup_power2_divisions=3)


def test_random_traces_keep_the_books_balanced() -> None:
    # Invariants on random traces, both modes: allocated <= reserved at all times, every byte
    # of a mapped segment is either allocated or cached free, and freeing everything then
    # emptying the cache returns reserved to 0.
    import random

    rng = random.Random(0)
    sizes = [256, 4000, 300 * KiB, MiB, 3 * MiB, 9 * MiB, 11 * MiB, 25 * MiB, 70 * MiB]
    for cfg in (AllocatorConfig(), EXPANDABLE, AllocatorConfig(max_split_size=32 * MiB)):
        sim = CachingAllocatorSim(cfg)
        live: list[int] = []
        for step in range(1500):
            if live and rng.random() < 0.45:
                sim.free(live.pop(rng.randrange(len(live))))
            else:
                sim.malloc(step, rng.choice(sizes) + rng.randrange(0, 4096))
                live.append(step)
            assert sim.stats.allocated <= sim.stats.reserved
        segs = sim.segments()
        assert sum(int(s["total"]) for s in segs) == sim.stats.reserved
        small = [s for s in segs if not s["large"]]
        assert sum(int(s["total"]) for s in small) == sim.stats.small_reserved
        assert sum(int(s["allocated"]) for s in small) == sim.stats.small_allocated
        assert sum(int(s["allocated"]) for s in segs) == sim.stats.allocated
        cached = sim.free_cached()["free_bytes"]
        assert sim.stats.allocated + cached == sim.stats.reserved
        for key in live:
            sim.free(key)
        sim.empty_cache()
        assert (sim.stats.reserved, sim.stats.allocated, sim.stats.segments) == (0, 0, 0)
