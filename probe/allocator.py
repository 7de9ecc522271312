"""A model of PyTorch's CUDA caching allocator, to turn an allocation trace into reserved bytes.

`torch.cuda.max_memory_allocated` counts the blocks handed to tensors; `max_memory_reserved` counts
what the allocator took from the driver (cudaMalloc segments, or mapped pages of expandable
segments). A real OOM happens when *reserved* cannot grow, so the planner needs the second figure
too. This module replays a sequence of alloc/free events (`probe.allocator_events`) through the
allocator's own rules and reports both peaks, the slack between them and how fragmented the cache
is. Stdlib only: no torch import, so the probe stays copyable to a bare GPU machine.

Sources (read, not guessed):

- `c10/cuda/CUDACachingAllocator.cpp`, pytorch/pytorch at commit 001074d25084 (the newest copy
  of that file the research index holds), class `DeviceCachingAllocator`: `malloc`,
  `alloc_found_block`, `free`/`free_block`, `try_merge_blocks`, `get_pool`, `should_split`,
  `get_allocation_size`, `round_size`, `get_free_block`, `alloc_block`,
  `release_available_cached_blocks`, `release_cached_blocks`/`release_blocks`,
  `release_block`, the expandable-segment path `find_expandable_block`, `map_block`,
  `try_allocate_expandable_block`, `unmap_block`, `release_expandable_segment`, and
  `struct ExpandableSegment` (`map`/`unmap`, Note [Expandable Segments]).
- torch 2.13.0's installed header `torch/include/c10/core/AllocatorConfig.h`: the size
  constants (lines 17-25: kSmallBuffer 2 MiB, kMinBlockSize 512, kSmallSize 1 MiB,
  kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB) and the 2.13 settings that replaced the
  hard-coded kLargeBuffer: `large_segment_size_` (line 340, default 20 MiB),
  `max_split_size_` (line 342, default SIZE_MAX = unlimited), `max_non_split_rounding_size_`
  (line 345; "default is 20 MiB", comment at line 185), `use_expandable_segments_` (line 353).
- `c10/core/AllocatorConfig.cpp` (`AcceleratorAllocatorConfig::parseMaxSplitSize`,
  `parseMaxNonSplitRoundingSize`): both settings must be >= kLargeBuffer (20 MiB).

What is modelled, per the source: sizes rounded up to 512 B (`round_size`, optionally to
power-of-two divisions); requests <= 1 MiB go to the small pool, larger ones to the large pool
(`get_pool`); a new segment is 2 MiB for the small pool, `large_segment_size` (20 MiB) for
requests under 10 MiB and the request rounded up to 2 MiB above that (`get_allocation_size`);
best fit = the smallest free block of the pool that is large enough, lowest address on ties
(`BlockComparatorSize` + `get_free_block`); a found block is split when the rest is >= 512 B
(small pool, or any pool with expandable segments) or > 1 MiB (large pool) and the request is
below `max_split_size` (`should_split`); blocks >= `max_split_size` serve only requests >=
`max_split_size` that they exceed by less than `max_non_split_rounding_size`; a freed block
merges with free neighbours of its segment (`free_block`/`try_merge_blocks`); when no segment can
be obtained (the `capacity` given here is what cudaMalloc/cuMemCreate can still hand out), the
allocator frees oversize cached blocks (`release_available_cached_blocks`, only with
`max_split_size` set), then every cached unsplit segment (`release_cached_blocks`), and retries
once before raising OOM (`malloc`). With `expandable_segments`, each pool has segments that
reserve address space for 9/8 of the device memory and map physical pages on demand: 2 MiB pages
for the small pool, `large_segment_size` (20 MiB) pages for the large pool (Note [Expandable
Segments]: "we use 2MiB pages for our small pool and 20MiB pages for our large pool"); a request
that no free block fits maps just enough pages at the lowest address where free + unmapped space
suffices (`find_expandable_block`, `map_block`), and `empty_cache` unmaps every whole page inside
a free block (`unmap_block`).

Not modelled (all absent from a single-stream training step or switched off by default): several
streams and `record_stream` events, CUDA graph private pools, `garbage_collection_threshold`
(active only with `set_per_process_memory_fraction`), the free-memory callbacks, switching
`expandable_segments` on or off in the middle of a trace, and `max_split_size` together with
expandable segments (there `release_available_cached_blocks` would reach `release_block`, which
asserts on expandable blocks; the model skips that step). Addresses of new segments are a bump
counter (cudaMalloc's real addresses only break ties between equal-sized free blocks).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from probe.allocator_blocks import Block, BlockPool, Segment, expandable_size, has_space
from probe.allocator_events import Event, TraceError

__all__ = [
    "K_MIN_BLOCK_SIZE",
    "K_SMALL_SIZE",
    "K_SMALL_BUFFER",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_LARGE_BUFFER",
    "MiB",
    "GiB",
    "AllocatorConfig",
    "AllocatorStats",
    "CachingAllocatorSim",
    "ReplayResult",
    "SimulatedOOM",
    "replay",
]

MiB = 1 << 20
GiB = 1 << 30

# torch 2.13 torch/include/c10/core/AllocatorConfig.h lines 17-25 (same values in the .cpp)
K_SMALL_BUFFER = 2 * MiB  # "small" allocations are packed in 2 MiB blocks
K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB  # largest "small" allocation is 1 MiB
K_MIN_LARGE_ALLOC = 10 * MiB  # allocations between 1 and 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2 * MiB  # round up large allocations to 2 MiB
# CUDACachingAllocator.cpp `kLargeBuffer`; AllocatorConfig.h line 340 `large_segment_size_`
K_LARGE_BUFFER = 20 * MiB


@dataclass(frozen=True)
class AllocatorConfig:
    """The allocator settings (`PYTORCH_ALLOC_CONF`) and the device the trace is replayed on.

    `capacity`: bytes the driver can still give the allocator (None = unlimited). A cudaMalloc
    or page mapping that would take reserved bytes above it fails, as on a full GPU.
    `device_memory`: the GPU's total memory, which sizes an expandable segment's address space
    (`find_expandable_block`: totalGlobalMem + totalGlobalMem / 8).
    """

    expandable_segments: bool = False
    max_split_size: int | None = None  # bytes; None = SIZE_MAX (the default: split everything)
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    large_segment_size: int = K_LARGE_BUFFER
    roundup_power2_divisions: int = 0  # one value for every size interval; 0 = off
    capacity: int | None = None
    device_memory: int = 80 * GiB

    def __post_init__(self) -> None:
        mss = self.max_split_size
        if mss is not None and mss < K_LARGE_BUFFER:
            # AllocatorConfig.cpp parseMaxSplitSize: "max_split_size_mb too small, must be >= 20"
            raise ValueError(f"max_split_size: must be >= {K_LARGE_BUFFER} bytes, got {mss}")
        if self.max_non_split_rounding_size < K_LARGE_BUFFER:
            raise ValueError(
                f"max_non_split_rounding_size: must be >= {K_LARGE_BUFFER} bytes (parseMaxNonSplit"
                f"RoundingSize), got {self.max_non_split_rounding_size}"
            )
        if self.large_segment_size < K_SMALL_BUFFER or self.large_segment_size % K_SMALL_BUFFER:
            raise ValueError("large_segment_size: must be a positive multiple of 2 MiB")
        divs = self.roundup_power2_divisions
        if divs < 0 or (divs > 1 and divs & (divs - 1)):
            # parseRoundUpPower2Divisions: "the divisions has to be power of 2 or 0"
            raise ValueError(f"roundup_power2_divisions: must be 0 or a power of 2, got {divs}")
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity: must be >= 0, got {self.capacity}")
        if self.device_memory <= 0:
            raise ValueError(f"device_memory: must be > 0, got {self.device_memory}")


class SimulatedOOM(Exception):
    """The allocator could not serve a request even after freeing its cache (`malloc`'s OOM)."""

    def __init__(self, size: int, alloc_size: int, allocated: int, reserved: int) -> None:
        self.size = size
        self.alloc_size = alloc_size
        self.allocated = allocated
        self.reserved = reserved
        super().__init__(
            f"out of memory: tried to allocate {alloc_size} bytes with {allocated} allocated and "
            f"{reserved} reserved"
        )


@dataclass
class AllocatorStats:
    """Counters named after `DeviceStats` (bytes unless the name says otherwise)."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    allocated_at_peak_reserved: int = 0  # highest allocated while reserved was at its peak
    small_allocated: int = 0  # the small pool's share of `allocated` / `reserved`
    small_reserved: int = 0
    small_allocated_at_peak: int = 0  # ... at the moment of `allocated_at_peak_reserved`
    small_reserved_at_peak: int = 0
    segments: int = 0  # live cudaMalloc segments + live expandable segments
    peak_segments: int = 0
    device_allocs: int = 0  # cudaMalloc calls or page mappings (num_device_alloc)
    device_frees: int = 0  # cudaFree calls or unmappings (num_device_free)
    alloc_retries: int = 0  # num_alloc_retries
    ooms: int = 0  # num_ooms
    requests: int = 0


class CachingAllocatorSim:
    """`DeviceCachingAllocator` for one device and one stream, replaying requests by id."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.stats = AllocatorStats()
        self._small = BlockPool(small=True)
        self._large = BlockPool(small=False)
        self._live: dict[Hashable, Block | None] = {}  # None: a 0-byte request (no block)
        self._next_address = 1 << 40
        mss = self.config.max_split_size
        self._mss = mss if mss is not None else 1 << 64  # SIZE_MAX: no block is oversize

    # -- sizes ---------------------------------------------------------------------------

    def round_size(self, size: int) -> int:
        """`round_size`: at least 512 B, a multiple of 512 B (or of a power-of-two division)."""
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE
        divs = self.config.roundup_power2_divisions
        if divs > 1 and size > K_MIN_BLOCK_SIZE * divs:
            return _roundup_power2_next_division(size, divs)
        return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE

    def allocation_size(self, size: int) -> int:
        """`get_allocation_size`: the size of a new segment for a (rounded) request."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self.config.large_segment_size
        return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE

    def _pool(self, size: int) -> BlockPool:
        """`get_pool`: requests up to kSmallSize go to the small pool."""
        return self._small if size <= K_SMALL_SIZE else self._large

    # -- public operations ---------------------------------------------------------------

    def malloc(self, key: Hashable, nbytes: int) -> None:
        """`DeviceCachingAllocator::malloc`; raises `SimulatedOOM` like the real one."""
        if key in self._live:
            raise TraceError(f"alloc {key!r}", "id is already allocated (free it first)")
        if nbytes == 0:  # NativeCachingAllocator::allocate: size 0 returns nullptr, no block
            self._live[key] = None
            return
        self.stats.requests += 1
        size = self.round_size(nbytes)
        pool = self._pool(size)
        alloc_size = self.allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size, alloc_size, retry=False)
        if block is None and self._release_available_cached_blocks(pool, size):
            block = self._alloc_block(pool, size, alloc_size, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(pool, size, alloc_size, retry=True)
        if block is None:
            self.stats.ooms += 1
            raise SimulatedOOM(size, alloc_size, self.stats.allocated, self.stats.reserved)
        self._alloc_found_block(key, pool, block, size)

    def free(self, key: Hashable) -> None:
        """`free` + `free_block`: return the block to its pool, merged with free neighbours."""
        if key not in self._live:
            raise TraceError(f"free {key!r}", "id is not allocated")
        block = self._live.pop(key)
        if block is None:
            return
        pool = self._small if block.small else self._large
        block.allocated = False
        self.stats.allocated -= block.size
        if block.small:
            self.stats.small_allocated -= block.size
        self._try_merge(pool, block, block.prev)
        self._try_merge(pool, block, block.next)
        pool.insert(block)

    def empty_cache(self) -> None:
        """`emptyCache` -> `release_cached_blocks`."""
        self._release_cached_blocks()

    def reset_peak(self) -> None:
        """`resetPeakStats`: peaks restart at the current values."""
        s = self.stats
        s.peak_allocated = s.allocated
        s.peak_reserved = s.reserved
        self._snapshot_peak()
        s.peak_segments = s.segments

    def _snapshot_peak(self) -> None:
        s = self.stats
        s.allocated_at_peak_reserved = s.allocated
        s.small_allocated_at_peak = s.small_allocated
        s.small_reserved_at_peak = s.small_reserved

    def live_ids(self) -> list[Hashable]:
        return list(self._live)

    def segments(self) -> list[dict[str, int | bool]]:
        """Per mapped range of memory (like `snapshot()`): total, allocated and free bytes."""
        heads: dict[int, Block] = {}
        b: Block | None
        for b in self._all_blocks():
            if b.mapped and (b.prev is None or not b.prev.mapped):
                heads[b.ptr] = b
        out: list[dict[str, int | bool]] = []
        for ptr in sorted(heads):
            b = heads[ptr]
            total = used = 0
            large = not heads[ptr].small
            expandable = heads[ptr].segment.expandable
            while b is not None and b.mapped:
                total += b.size
                used += b.size if b.allocated else 0
                b = b.next
            out.append(
                {"total": total, "allocated": used, "large": large, "expandable": expandable}
            )
        return out

    def free_block_sizes(self) -> list[int]:
        """Sizes of the cached free blocks (both pools, mapped memory only)."""
        return [b.size for b in self._small.free_blocks() + self._large.free_blocks()]

    def free_cached(self) -> dict[str, int]:
        """Cached free bytes now: total, largest block, and bytes in split (unreleasable) blocks."""
        blocks = self._small.free_blocks() + self._large.free_blocks()
        return {
            "free_bytes": sum(b.size for b in blocks),
            "largest_free_block": max((b.size for b in blocks), default=0),
            # like DeviceStats.inactive_split_bytes, which leaves expandable segments out
            "inactive_split_bytes": sum(
                b.size for b in blocks if b.is_split() and not b.segment.expandable
            ),
        }

    # -- block search and splitting --------------------------------------------------------

    def _get_free_block(self, pool: BlockPool, size: int) -> Block | None:
        """`get_free_block`: best fit, with the expandable-tail and oversize-block rules."""
        i = pool.lower_bound(size)
        if i == len(pool):
            return None
        b = pool.at(i)
        if b.segment.expandable:
            # a free block at the end of an expandable segment counts as the size it can grow to,
            # so a block that fits without growing the segment is preferred
            while i + 1 < len(pool) and expandable_size(pool.at(i + 1)) < expandable_size(b):
                i += 1
                b = pool.at(i)
                if not b.segment.expandable:
                    break
        if size < self._mss and b.size >= self._mss:
            return None  # do not return an oversized block for a small request
        if size >= self._mss and b.size >= size + self.config.max_non_split_rounding_size:
            return None  # oversized block rounded up only within max_non_split_rounding_size
        pool.remove(b)
        return b

    def _should_split(self, pool: BlockPool, block: Block, size: int) -> bool:
        """`should_split`."""
        remaining = block.size - size
        if pool.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self._mss and remaining > K_SMALL_SIZE

    def _alloc_found_block(self, key: Hashable, pool: BlockPool, block: Block, size: int) -> None:
        """`alloc_found_block`: split off the tail into the pool when `should_split` says so."""
        if self._should_split(pool, block, size):
            head = Block(block.ptr, size, block.small, block.segment)
            head.splice(block.prev, block)
            block.ptr += size
            block.size -= size
            pool.insert(block)
            block = head
        block.allocated = True
        self._live[key] = block
        s = self.stats
        s.allocated += block.size
        if block.small:
            s.small_allocated += block.size
        s.peak_allocated = max(s.peak_allocated, s.allocated)
        # the most allocated while reserved is at its peak
        if s.reserved == s.peak_reserved and s.allocated > s.allocated_at_peak_reserved:
            self._snapshot_peak()

    def _try_merge(self, pool: BlockPool, dst: Block, src: Block | None) -> int:
        """`try_merge_blocks`: absorb a free neighbour with the same mapped state."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # -- getting and returning device memory -----------------------------------------------

    def _fits_capacity(self, nbytes: int) -> bool:
        cap = self.config.capacity
        return cap is None or self.stats.reserved + nbytes <= cap

    def _grow_reserved(self, nbytes: int, small: bool) -> None:
        s = self.stats
        s.reserved += nbytes
        if small:
            s.small_reserved += nbytes
        s.device_allocs += 1
        if s.reserved > s.peak_reserved:
            s.peak_reserved = s.reserved
            self._snapshot_peak()

    def _add_segment(self, size: int, page: int | None) -> Segment:
        seg = Segment(self._next_address, size, page)
        self._next_address += size + K_ROUND_LARGE
        s = self.stats
        s.segments += 1
        s.peak_segments = max(s.peak_segments, s.segments)
        return seg

    def _alloc_block(
        self, pool: BlockPool, size: int, alloc_size: int, retry: bool
    ) -> Block | None:
        """`alloc_block`: a new cudaMalloc segment of `alloc_size`, or expandable pages."""
        if retry:
            self.stats.alloc_retries += 1
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size)
        if not self._fits_capacity(alloc_size):
            return None  # cudaMalloc -> cudaErrorMemoryAllocation
        seg = self._add_segment(alloc_size, None)
        self._grow_reserved(alloc_size, pool.small)
        return Block(seg.base, alloc_size, pool.small, seg)

    def _release_block(self, pool: BlockPool, block: Block) -> None:
        """`release_block`: cudaFree a whole cached segment."""
        pool.remove(block)
        s = self.stats
        s.reserved -= block.size
        if pool.small:
            s.small_reserved -= block.size
        s.segments -= 1
        s.device_frees += 1

    def _release_available_cached_blocks(self, pool: BlockPool, size: int) -> bool:
        """`release_available_cached_blocks`: free oversize cached blocks (max_split_size set)."""
        if self.config.max_split_size is None:
            return False
        key = max(size, self._mss)
        i = pool.lower_bound(key)
        if i < len(pool):
            if pool.at(i).segment.expandable:
                return False  # release_block asserts on expandable blocks; not modelled
            self._release_block(pool, pool.at(i))
            return True
        released = 0
        i -= 1
        while released < key and i >= 0:
            b = pool.at(i)
            if b.size < self._mss or b.segment.expandable:
                break
            released += b.size
            self._release_block(pool, b)
            i -= 1
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """`release_cached_blocks` -> `release_blocks` for the large, then the small pool."""
        for pool in (self._large, self._small):
            to_unmap: list[Block] = []
            for b in pool.free_blocks():
                if b.segment.expandable:
                    to_unmap.append(b)
                elif not b.is_split():
                    self._release_block(pool, b)
            for b in to_unmap:
                self._unmap_block(pool, b)
                if not b.mapped and not b.is_split():
                    self._release_expandable_segment(pool, b)
        return True

    # -- expandable segments --------------------------------------------------------------

    def _find_expandable_block(self, pool: BlockPool, size: int) -> Block:
        """`find_expandable_block`: lowest address with enough free + unmapped space."""
        for c in pool.unmapped_blocks():
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if has_space(c, size):
                return c
        page = K_SMALL_BUFFER if pool.small else self.config.large_segment_size
        space = self.config.device_memory + self.config.device_memory // 8
        seg = self._add_segment(-(-space // page) * page, page)
        candidate = Block(seg.base, seg.size, pool.small, seg, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, pool: BlockPool, to_map: Block, size: int) -> bool:
        """`map_block` + `ExpandableSegment::map`: back `size` bytes with whole pages."""
        seg = to_map.segment
        assert seg.page is not None
        begin = (to_map.ptr - seg.base) // seg.page
        end = -(-(to_map.ptr + size - seg.base) // seg.page)
        mapped = (end - begin) * seg.page
        if mapped == 0 or not self._fits_capacity(mapped):
            return False  # cuMemCreate OOM: pages created so far are released, nothing mapped
        pool.remove_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            rest = Block(to_map.ptr + mapped, to_map.size - mapped, pool.small, seg, mapped=False)
            rest.splice(to_map, to_map.next)
            pool.insert_unmapped(rest)
            to_map.size = mapped
        self._try_merge(pool, to_map, to_map.prev)
        self._try_merge(pool, to_map, to_map.next)
        pool.insert(to_map)
        self._grow_reserved(mapped, pool.small)
        return True

    def _try_allocate_expandable_block(self, pool: BlockPool, size: int) -> Block | None:
        """`try_allocate_expandable_block`: map pages until a free block of `size` exists."""
        c = self._find_expandable_block(pool, size)
        if not c.mapped and not self._map_block(pool, c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(pool, nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt  # map_block merged c into nxt
        pool.remove(c)
        return c

    def _unmap_block(self, pool: BlockPool, block: Block) -> None:
        """`unmap_block`: give back the whole pages inside a free block of an expandable segment."""
        seg = block.segment
        assert seg.page is not None
        begin = -(-(block.ptr - seg.base) // seg.page)
        end = (block.ptr + block.size - seg.base) // seg.page
        if begin >= end:
            return
        u_ptr = seg.base + begin * seg.page
        u_size = (end - begin) * seg.page
        pool.remove(block)
        before = u_ptr - block.ptr
        if before > 0:
            head = Block(block.ptr, before, pool.small, seg)
            head.splice(block.prev, block)
            pool.insert(head)
        after = block.size - before - u_size
        if after > 0:
            tail = Block(u_ptr + u_size, after, pool.small, seg)
            tail.splice(block, block.next)
            pool.insert(tail)
        block.ptr = u_ptr
        block.size = u_size
        block.mapped = False
        self._try_merge(pool, block, block.prev)
        self._try_merge(pool, block, block.next)
        pool.insert_unmapped(block)
        self.stats.reserved -= u_size
        if pool.small:
            self.stats.small_reserved -= u_size
        self.stats.device_frees += 1

    def _release_expandable_segment(self, pool: BlockPool, block: Block) -> None:
        """`release_expandable_segment`: drop a segment whose pages are all unmapped."""
        pool.remove_unmapped(block)
        self.stats.segments -= 1

    def _all_blocks(self) -> list[Block]:
        blocks = self._small.free_blocks() + self._large.free_blocks()
        blocks += [b for b in self._live.values() if b is not None]
        return blocks


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """`roundup_power2_next_division`: round up to the next of `divisions` steps per octave."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


# -- replay ------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    """What a replay reports (bytes): the peaks, the slack between them, the fragmentation."""

    config: dict[str, Any]
    peak_allocated: int
    peak_reserved: int
    allocated_at_peak_reserved: int
    small_pool_reserved_at_peak: int  # the small pool's part of the reserved peak
    small_pool_allocated_at_peak: int
    final_allocated: int
    final_reserved: int
    peak_segments: int
    final_segments: int
    requests: int
    device_allocs: int
    device_frees: int
    alloc_retries: int
    ooms: int
    oom_at_event: int | None
    free_cached: dict[str, int] = field(default_factory=dict)

    @property
    def slack(self) -> int:
        """max_memory_reserved - max_memory_allocated."""
        return self.peak_reserved - self.peak_allocated

    @property
    def slack_ratio(self) -> float:
        """max_memory_reserved / max_memory_allocated (1.0 = no slack)."""
        return self.peak_reserved / self.peak_allocated if self.peak_allocated else 1.0

    @property
    def fragmentation_at_peak(self) -> float:
        """Share of the reserved peak not allocated at that moment (cached, unused)."""
        if not self.peak_reserved:
            return 0.0
        return 1.0 - self.allocated_at_peak_reserved / self.peak_reserved

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["slack"] = self.slack
        out["slack_ratio"] = round(self.slack_ratio, 6)
        out["fragmentation_at_peak"] = round(self.fragmentation_at_peak, 6)
        return out


def replay(
    events: Iterable[Event],
    config: AllocatorConfig | None = None,
    *,
    stop_on_oom: bool = True,
    windows: list[tuple[int, int]] | None = None,
) -> ReplayResult:
    """Run a trace through the simulated allocator.

    An OOM stops the replay (`oom_at_event` = its index) unless `stop_on_oom` is False, in which
    case the failed request is skipped (its later `free` is ignored) and the replay goes on.
    `windows`, when given, receives (peak allocated, peak reserved) of each stretch between
    `reset_peak` marks, the one before the first mark included: per-length peaks of a sweep in
    one replay (a GPU memtest resets the peak stats at each length's start).
    Raises `TraceError` for a `free` of an id that is not live or a duplicate live id.
    """
    sim = CachingAllocatorSim(config)
    oom_at: int | None = None
    failed: set[Hashable] = set()
    for i, ev in enumerate(events):
        if ev.op == "alloc":
            try:
                sim.malloc(ev.id, ev.size)
            except SimulatedOOM:
                if oom_at is None:
                    oom_at = i
                if stop_on_oom:
                    break
                failed.add(ev.id)
        elif ev.op == "free":
            if ev.id in failed:
                failed.discard(ev.id)
                continue
            sim.free(ev.id)
        elif ev.op == "empty_cache":
            sim.empty_cache()
        elif ev.op == "reset_peak":
            if windows is not None:
                windows.append((sim.stats.peak_allocated, sim.stats.peak_reserved))
            sim.reset_peak()
    s = sim.stats
    if windows is not None:
        windows.append((s.peak_allocated, s.peak_reserved))
    return ReplayResult(
        config=asdict(sim.config),
        peak_allocated=s.peak_allocated,
        peak_reserved=s.peak_reserved,
        allocated_at_peak_reserved=s.allocated_at_peak_reserved,
        small_pool_reserved_at_peak=s.small_reserved_at_peak,
        small_pool_allocated_at_peak=s.small_allocated_at_peak,
        final_allocated=s.allocated,
        final_reserved=s.reserved,
        peak_segments=s.peak_segments,
        final_segments=s.segments,
        requests=s.requests,
        device_allocs=s.device_allocs,
        device_frees=s.device_frees,
        alloc_retries=s.alloc_retries,
        ooms=s.ooms,
        oom_at_event=oom_at,
        free_cached=sim.free_cached(),
    )
