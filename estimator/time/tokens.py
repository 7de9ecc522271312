"""Token accounting: how many tokens a run trains on.

A run is a list of stages; each stage is either a token count or a dataset of sample lengths,
trained for some epochs. For a dataset and a maximum sequence length, samples longer than the
maximum are dropped (the default, what seed 000 plans) or truncated to it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from estimator.errors import EstimatorInputError
from estimator.spec import ModelSpec

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022 ("Chinchilla"), Table 3: ~20 tokens/param
LENGTH_FIELDS = ("length", "tokens", "n_tokens")
MAX_LENGTH = 10**9
MAX_SAMPLES = 10_000_000
Overflow = Literal["drop", "truncate"]


def chinchilla_tokens(params: float) -> float:
    """Compute-optimal training tokens: 20 per parameter (Hoffmann et al. 2022, Table 3 and the
    fitted approach 1/2 rule of thumb). Assumes a dense model; N is the total parameter count."""
    return CHINCHILLA_TOKENS_PER_PARAM * float(params)


def _length(value: object, where: str, field: str) -> int:
    """One sample length: a positive integer (a float with no fraction is accepted)."""
    if isinstance(value, bool):
        raise EstimatorInputError(field, f"{where}: {value!r} is not a token count")
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text) if any(ch in text for ch in ".eE") else int(text)
        except ValueError:
            raise EstimatorInputError(field, f"{where}: {value!r} is not a token count") from None
    elif isinstance(value, (int, float)):
        number = value
    else:
        raise EstimatorInputError(field, f"{where}: {value!r} is not a token count")
    if isinstance(number, float):
        if not math.isfinite(number) or number != int(number):
            raise EstimatorInputError(field, f"{where}: {value!r} is not a whole token count")
        number = int(number)
    if not 1 <= number <= MAX_LENGTH:
        raise EstimatorInputError(field, f"{where}: length {number} is outside 1..{MAX_LENGTH}")
    return number


def _check_count(lengths: list[int], field: str) -> list[int]:
    if not lengths:
        raise EstimatorInputError(field, "no sample lengths found")
    if len(lengths) > MAX_SAMPLES:
        raise EstimatorInputError(field, f"more than {MAX_SAMPLES} samples")
    return lengths


def parse_lengths(text: str, fmt: str = "text", field: str = "dataset") -> list[int]:
    """Sample lengths from file contents. `fmt`: `csv` (a column named length/tokens/n_tokens,
    or the only column; a header row is optional for a single column), `jsonl` (one object per
    line with a length/tokens/n_tokens field, or a bare number), `json` (a list of numbers or of
    such objects), `text` (one number per line). Blank lines are skipped; a bad line raises
    EstimatorInputError naming it (1-based)."""
    if fmt == "csv":
        return _check_count(_parse_csv(text, field), field)
    if fmt == "jsonl":
        out: list[int] = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EstimatorInputError(field, f"line {n}: not JSON ({exc.msg})") from None
            out.append(_from_item(item, f"line {n}", field))
        return _check_count(out, field)
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EstimatorInputError(field, f"line {exc.lineno}: not JSON ({exc.msg})") from None
        if not isinstance(data, list):
            raise EstimatorInputError(field, "a JSON file must hold a list of lengths")
        return _check_count([_from_item(v, f"item {i}", field) for i, v in enumerate(data)], field)
    if fmt == "text":
        out = [
            _length(line, f"line {n}", field)
            for n, line in enumerate(text.splitlines(), start=1)
            if line.strip()
        ]
        return _check_count(out, field)
    raise EstimatorInputError(field, f"unknown length file format {fmt!r}")


def _from_item(item: object, where: str, field: str) -> int:
    if isinstance(item, dict):
        for key in LENGTH_FIELDS:
            if key in item:
                return _length(item[key], where, field)
        raise EstimatorInputError(
            field, f"{where}: no field named {', '.join(LENGTH_FIELDS)} in {sorted(item)}"
        )
    return _length(item, where, field)


def _parse_csv(text: str, field: str) -> list[int]:
    rows = [(n, row) for n, row in enumerate(csv.reader(io.StringIO(text)), start=1) if row]
    if not rows:
        return []
    first_n, header = rows[0]
    names = [h.strip().lower() for h in header]
    column = next((names.index(k) for k in LENGTH_FIELDS if k in names), None)
    body = rows[1:]
    if column is None:
        if len(header) != 1:
            raise EstimatorInputError(
                field,
                f"line {first_n}: {len(header)} columns and none named {', '.join(LENGTH_FIELDS)}",
            )
        column = 0
        try:
            _length(header[0], f"line {first_n}", field)
            body = rows  # no header row: the first row is a length
        except EstimatorInputError:
            pass  # a single column with some other header name
    out: list[int] = []
    for n, row in body:
        if len(row) <= column:
            raise EstimatorInputError(field, f"line {n}: has no column {column + 1}")
        out.append(_length(row[column], f"line {n}", field))
    return out


def read_lengths(path: str | Path, field: str = "dataset") -> list[int]:
    """Read sample lengths from a file; the format follows the suffix (.csv, .jsonl, .json,
    anything else: one number per line)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise EstimatorInputError(field, f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EstimatorInputError(field, f"{p} is not UTF-8 text") from None
    suffix = p.suffix.lower()
    fmt = {".csv": "csv", ".jsonl": "jsonl", ".json": "json"}.get(suffix, "text")
    try:
        return parse_lengths(text, fmt, field)
    except EstimatorInputError as exc:
        raise EstimatorInputError(exc.field, f"{p.name}: {exc.message}") from None


def percentile(sorted_values: Sequence[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default `linear` method)."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class LengthStats:
    samples: int
    tokens: int
    p50: float
    p90: float
    max: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "samples": self.samples,
            "tokens": self.tokens,
            "p50": self.p50,
            "p90": self.p90,
            "max": self.max,
        }


def length_stats(lengths: Iterable[int]) -> LengthStats:
    """Count, total and p50/p90/max of the sample lengths (linear-interpolated percentiles)."""
    values = sorted(lengths)
    return LengthStats(
        len(values), sum(values), percentile(values, 50), percentile(values, 90), values[-1]
    )


@dataclass(frozen=True)
class SeqLenFit:
    """What a maximum sequence length keeps of a dataset (one epoch)."""

    max_seq: int
    samples: int
    kept: int  # samples trained on whole
    dropped: int  # samples over max_seq that are left out (overflow == "drop")
    truncated: int  # samples over max_seq cut to max_seq (overflow == "truncate")
    tokens_total: int
    tokens_kept: int
    overflow: Overflow

    @property
    def over(self) -> int:
        return self.dropped + self.truncated

    def as_dict(self) -> dict[str, object]:
        return {
            "max_seq": self.max_seq,
            "samples": self.samples,
            "kept": self.kept,
            "dropped": self.dropped,
            "truncated": self.truncated,
            "over_fraction": self.over / self.samples if self.samples else 0.0,
            "tokens_total": self.tokens_total,
            "tokens_kept": self.tokens_kept,
            "overflow": self.overflow,
        }


def fit_seq_len(lengths: Sequence[int], max_seq: int, overflow: Overflow = "drop") -> SeqLenFit:
    """Samples and tokens kept at `max_seq`: a sample longer than `max_seq` is dropped whole or
    truncated to `max_seq` tokens. Assumes one sample per sequence (no packing)."""
    if max_seq < 1:
        raise EstimatorInputError("max_seq", f"{max_seq} is not a positive length")
    over = [n for n in lengths if n > max_seq]
    under = [n for n in lengths if n <= max_seq]
    kept_tokens = sum(under) + (len(over) * max_seq if overflow == "truncate" else 0)
    return SeqLenFit(
        max_seq=max_seq,
        samples=len(lengths),
        kept=len(under),
        dropped=len(over) if overflow == "drop" else 0,
        truncated=len(over) if overflow == "truncate" else 0,
        tokens_total=sum(lengths),
        tokens_kept=kept_tokens,
        overflow=overflow,
    )


def seq_len_report(
    lengths: Sequence[int], max_seqs: Iterable[int], overflow: Overflow = "drop"
) -> dict[str, object]:
    """For each candidate maximum sequence length: samples kept, dropped or truncated, tokens
    kept; plus the dataset's length percentiles."""
    return {
        "stats": length_stats(lengths).as_dict(),
        "by_max_seq": [fit_seq_len(lengths, s, overflow).as_dict() for s in max_seqs],
    }


@dataclass(frozen=True)
class Stage:
    """One stage of a run: `tokens` per epoch, or sample `lengths`, trained `epochs` times."""

    name: str
    epochs: float = 1.0
    tokens: float | None = None
    lengths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.lengths is None):
            raise EstimatorInputError(f"stages.{self.name}", "give tokens or lengths, not both")
        if not 0 < self.epochs <= 1e6:
            raise EstimatorInputError(
                f"stages.{self.name}.epochs", f"{self.epochs} not in (0, 1e6]"
            )
        if self.tokens is not None and not 0 < self.tokens <= 1e16:
            raise EstimatorInputError(
                f"stages.{self.name}.tokens", f"{self.tokens} not in (0, 1e16]"
            )


def stage_tokens(stage: Stage, max_seq: int | None, overflow: Overflow = "drop") -> dict[str, Any]:
    """Tokens a stage trains on: epochs x (tokens, or the dataset's tokens kept at max_seq)."""
    if stage.lengths is None:
        per_epoch = float(stage.tokens or 0.0)
        fit: dict[str, object] | None = None
    else:
        seq = max_seq if max_seq is not None else max(stage.lengths)
        f = fit_seq_len(stage.lengths, seq, overflow)
        per_epoch = float(f.tokens_kept)
        fit = f.as_dict()
    return {
        "name": stage.name,
        "epochs": stage.epochs,
        "tokens_per_epoch": per_epoch,
        "tokens": per_epoch * stage.epochs,
        "fit": fit,
    }


def run_tokens(
    stages: Sequence[Stage], max_seq: int | None = None, overflow: Overflow = "drop"
) -> dict[str, Any]:
    """Total tokens of a multi-stage run (sum over stages of epochs x tokens per epoch)."""
    rows = [stage_tokens(s, max_seq, overflow) for s in stages]
    total = sum(float(r["tokens"]) for r in rows)
    return {"tokens": total, "stages": rows}


def chinchilla_for(spec: ModelSpec) -> float:
    """Chinchilla tokens for a spec: 20 x params_total (MoE: total, not active, parameters)."""
    return chinchilla_tokens(spec.params_total)


TARGETS = ("chinchilla",)


def resolve_tokens(
    spec: ModelSpec,
    *,
    tokens: float | None,
    target_tokens: str | None,
    dataset_lengths: Sequence[int] | None,
    epochs: float = 1.0,
    max_seq: int | None = None,
    overflow: Overflow = "drop",
) -> float | None:
    """The run's tokens from exactly one of: `tokens` (--tokens), `target_tokens="chinchilla"`
    (20 per parameter, Hoffmann et al. 2022), or a dataset's sample lengths (--dataset) kept at
    `max_seq` (longer samples dropped or truncated) times `epochs`. None when none is given."""
    if tokens is not None or target_tokens is not None or dataset_lengths is not None:
        given = [
            n
            for n, v in (
                ("tokens", tokens),
                ("target_tokens", target_tokens),
                ("dataset", dataset_lengths),
            )
            if v is not None
        ]
        if len(given) > 1:
            raise EstimatorInputError(
                given[1], f"give one of tokens, target_tokens, dataset; got {given}"
            )
    if not 0 < epochs <= 1e6:
        raise EstimatorInputError("epochs", f"{epochs} is not in (0, 1e6]")
    if tokens is not None:
        if not 0 < tokens <= 1e16:
            raise EstimatorInputError("tokens", f"{tokens} is not in (0, 1e16]")
        return float(tokens) * epochs
    if target_tokens is not None:
        if target_tokens.lower() not in TARGETS:
            raise EstimatorInputError("target_tokens", f"{target_tokens!r}; known: {TARGETS}")
        return chinchilla_for(spec) * epochs
    if dataset_lengths is not None:
        seq = max_seq if max_seq is not None else max(dataset_lengths)
        return float(fit_seq_len(dataset_lengths, seq, overflow).tokens_kept) * epochs
    return None


def resolve_stages(
    stages: Sequence[Mapping[str, Any]], max_seq: int | None, overflow: Overflow = "drop"
) -> dict[str, Any]:
    """A multi-stage run: each stage {"name", "epochs", and "tokens" or "lengths"}.
    Returns {"tokens": total, "stages": [...per stage tokens and fit...]}."""
    parsed = []
    for i, raw in enumerate(stages):
        name = str(raw.get("name") or f"stage{i + 1}")
        lengths = raw.get("lengths")
        parsed.append(
            Stage(
                name=name,
                epochs=float(raw.get("epochs", 1.0)),
                tokens=None if raw.get("tokens") is None else float(raw["tokens"]),
                lengths=None if lengths is None else tuple(int(n) for n in lengths),
            )
        )
    return run_tokens(parsed, max_seq, overflow)


@dataclass(frozen=True)
class RunTokens:
    """What the run trains on, for the recommendation: a token count (times `epochs`), or a
    dataset's sample `lengths` of which those longer than the sequence length are dropped or
    truncated (`overflow`)."""

    tokens: float | None = None
    lengths: Sequence[int] | None = None
    epochs: float = 1.0
    overflow: Overflow = "drop"

    def at(self, seq: int) -> tuple[float | None, dict[str, Any] | None]:
        """Tokens at maximum length `seq`, and the dataset's fit report (None without one)."""
        if self.lengths is None:
            return (None if self.tokens is None else self.tokens * self.epochs), None
        fit = fit_seq_len(self.lengths, seq, self.overflow)
        return fit.tokens_kept * self.epochs, fit.as_dict()
