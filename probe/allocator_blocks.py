"""The allocator's bookkeeping: segments, blocks and the per-pool sets of free blocks.

Mirrors `struct Block`, `struct BlockPool` (with `BlockComparatorSize` / `BlockComparatorAddress`
order) and the expandable `struct ExpandableSegment` of `c10/cuda/CUDACachingAllocator.cpp`
(see `probe.allocator` for the commit). A Block is a slice of a segment; its neighbours in the
segment are `prev`/`next`; free mapped blocks sit in their pool, ordered by (size, address);
unmapped ranges of expandable segments sit in the pool's `unmapped` set, ordered by address.
Stdlib only.
"""

from __future__ import annotations

import bisect

__all__ = ["Segment", "Block", "BlockPool", "expandable_size", "has_space"]


class Segment:
    """One cudaMalloc segment, or one expandable segment (`page` set) with its address space."""

    __slots__ = ("base", "size", "page")

    def __init__(self, base: int, size: int, page: int | None) -> None:
        self.base = base
        self.size = size
        self.page = page

    @property
    def expandable(self) -> bool:
        return self.page is not None


class Block:
    """`struct Block`: address range, in-use flag, neighbours in the same segment."""

    __slots__ = ("ptr", "size", "small", "segment", "allocated", "mapped", "prev", "next")

    def __init__(self, ptr: int, size: int, small: bool, segment: Segment, mapped: bool = True):
        self.ptr = ptr
        self.size = size
        self.small = small
        self.segment = segment
        self.allocated = False
        self.mapped = mapped
        self.prev: Block | None = None
        self.next: Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: Block | None, after: Block | None) -> None:
        """`Block::splice`: put this block between `before` and `after`."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class BlockPool:
    """`struct BlockPool`: free mapped blocks ordered by (size, address), unmapped by address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}
        self._unmapped_keys: list[int] = []
        self._unmapped: dict[int, Block] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def insert(self, b: Block) -> None:
        bisect.insort(self._keys, (b.size, b.ptr))
        self._blocks[b.ptr] = b

    def remove(self, b: Block) -> None:
        i = bisect.bisect_left(self._keys, (b.size, b.ptr))
        assert self._keys[i] == (b.size, b.ptr), "block not in pool"
        del self._keys[i]
        del self._blocks[b.ptr]

    def lower_bound(self, size: int) -> int:
        """Index of the smallest free block with at least `size` bytes (lowest address first)."""
        return bisect.bisect_left(self._keys, (size, -1))

    def at(self, i: int) -> Block:
        return self._blocks[self._keys[i][1]]

    def free_blocks(self) -> list[Block]:
        return [self._blocks[ptr] for _, ptr in self._keys]

    def insert_unmapped(self, b: Block) -> None:
        bisect.insort(self._unmapped_keys, b.ptr)
        self._unmapped[b.ptr] = b

    def remove_unmapped(self, b: Block) -> None:
        i = bisect.bisect_left(self._unmapped_keys, b.ptr)
        assert self._unmapped_keys[i] == b.ptr, "block not in the unmapped set"
        del self._unmapped_keys[i]
        del self._unmapped[b.ptr]

    def unmapped_blocks(self) -> list[Block]:
        return [self._unmapped[ptr] for ptr in self._unmapped_keys]


def expandable_size(b: Block) -> int:
    """`get_free_block`'s `expandable_size`: a block plus the unmapped space right after it."""
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def has_space(b: Block | None, size: int) -> bool:
    """`find_expandable_block`'s `has_available_address_space`."""
    total = 0
    while total < size and b is not None and not b.allocated:
        total += b.size
        b = b.next
    return total >= size
