"""Sample packing: the rows a packed dataset trains on, from its sample lengths.

The rule is TRL's `pack_dataset` (trl f2cd5771, trl/data_utils.py lines 739-933):
- `bfd` (TRL's default `packing_strategy`, trl/trainer/sft_config.py:232): each sample is cut to
  `seq_len` (overflow tokens are dropped), then samples are placed longest first, each into the
  open row whose free space is the smallest that still holds it (best-fit decreasing; a new row
  when none does). Rows never exceed `seq_len`.
- `bfd_split`: as `bfd`, but a long sample is split into `seq_len` pieces (the last one shorter)
  instead of being cut, so no token is lost.
- `wrapped`: all tokens concatenated and cut every `seq_len` tokens, ignoring sample boundaries.
TRL runs the packing through `datasets.Dataset.map(batched=True)`, whose default `batch_size` is
1000 rows (datasets' `Dataset.map` signature), so rows are packed within each block of 1000
samples, in file order; `block` reproduces that (0 packs the whole dataset at once).
Other trainers' rules (axolotl multipack, LLaMA-Factory greedy knapsack, torchtune greedy) also
fill rows up to `seq_len` without crossing it; trainfit uses `bfd` for them and says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from estimator.errors import EstimatorInputError

Strategy = Literal["bfd", "bfd_split", "wrapped"]
STRATEGIES: tuple[Strategy, ...] = ("bfd", "bfd_split", "wrapped")
DATASETS_MAP_BATCH = 1000  # datasets.Dataset.map(batch_size=1000) default


def _best_fit_decreasing(lengths: Sequence[int], seq_len: int) -> list[int]:
    """Row lengths of a best-fit-decreasing packing of `lengths` (each <= seq_len)."""
    rows: list[int] = []
    free: list[tuple[int, int]] = []  # (free space, row index), sorted
    for n in sorted(lengths, reverse=True):
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            space, row = free.pop(at)
        else:
            space, row = seq_len, len(rows)
            rows.append(0)
        rows[row] += n
        if space - n > 0:
            bisect.insort(free, (space - n, row))
    return rows


def _pieces(n: int, seq_len: int) -> list[int]:
    full, rest = divmod(n, seq_len)
    return [seq_len] * full + ([rest] if rest else [])


def pack_block(lengths: Sequence[int], seq_len: int, strategy: Strategy) -> list[int]:
    kept = [n for n in lengths if n > 0]  # TRL filters out empty sequences first
    if strategy == "wrapped":
        return _pieces(sum(kept), seq_len)
    if strategy == "bfd_split":
        kept = [p for n in kept for p in _pieces(n, seq_len)]
    else:
        kept = [min(n, seq_len) for n in kept]
    return _best_fit_decreasing(kept, seq_len)


def pack_lengths(
    lengths: Sequence[int],
    seq_len: int,
    strategy: str = "bfd",
    block: int = DATASETS_MAP_BATCH,
) -> list[int]:
    """The length of every packed row (each <= seq_len)."""
    if seq_len < 1:
        raise EstimatorInputError("packing.seq_len", f"{seq_len} is not a positive length")
    if strategy not in STRATEGIES:
        raise EstimatorInputError(
            "packing.strategy", f"{strategy!r} is not one of {', '.join(STRATEGIES)}"
        )
    step = block if block > 0 else max(len(lengths), 1)
    rows: list[int] = []
    for start in range(0, len(lengths), step):
        rows += pack_block(lengths[start : start + step], seq_len, strategy)
    return rows


@dataclass(frozen=True)
class PackedFit:
    """What packing at `max_seq` makes of a dataset (one epoch)."""

    max_seq: int
    samples: int
    rows: int
    tokens_total: int
    tokens_kept: int  # tokens in the packed rows (bfd drops what is cut off long samples)
    samples_cut: int  # samples longer than max_seq (cut by bfd, split by bfd_split/wrapped)
    strategy: str

    def as_dict(self) -> dict[str, object]:
        return {
            "max_seq": self.max_seq,
            "samples": self.samples,
            "rows": self.rows,
            "fill": self.tokens_kept / (self.rows * self.max_seq) if self.rows else 0.0,
            "tokens_total": self.tokens_total,
            "tokens_kept": self.tokens_kept,
            "samples_cut": self.samples_cut,
            "dropped": 0,
            "strategy": self.strategy,
        }


def packing_report(
    lengths: Sequence[int], max_seqs: Iterable[int], strategy: str = "bfd"
) -> list[dict[str, object]]:
    """Per candidate maximum length: packed rows, fill, tokens kept (no sample is dropped)."""
    out = []
    for s in max_seqs:
        rows = pack_lengths(lengths, s, strategy)
        out.append(
            PackedFit(
                max_seq=s,
                samples=len(lengths),
                rows=len(rows),
                tokens_total=sum(lengths),
                tokens_kept=sum(rows),
                samples_cut=sum(1 for n in lengths if n > s),
                strategy=strategy,
            ).as_dict()
        )
    return out


def trl_strategy(name: str | None) -> tuple[Strategy, str | None]:
    """A config's packing strategy as one of TRL's, with a note when it was approximated."""
    if name in STRATEGIES:
        return name, None
    return "bfd", f"packing strategy {name!r} is counted as TRL's best-fit decreasing (bfd)"
