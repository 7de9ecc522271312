"""Published-case benchmark: the estimator against peak memory that others measured on real runs.

`bench/data/published_cases.json` holds every case of the shared reference set (torchtitan's
benchmarks, torchtune's README tables, Liger-Kernel's HF example) verbatim under `published`,
plus the rows of torchtitan's 2024 document the set left out (its Table 6, copied from the
document in the same fields; grouped with that document's other rows), and under `mapping`
what this benchmark sends to the estimator: model, setup, sequence length, GPU, which counter
the source read and therefore which estimate figure is compared:

- `allocated` (`max_memory_allocated`, torchtune's `active_bytes.all.peak`): the document's
  `allocated_bytes`; a document without it (before issue 10's stacks) has `peak_bytes` =
  allocated + the CUDA context (`components.overhead`), so the context is taken off;
- `reserved` (`max_memory_reserved`, torch's caching allocator): `reserved_bytes`, which like
  the counter holds no CUDA context (issue 10 item 4);
- `reserved+context` (`nvidia-smi`): `reserved_bytes` + `components.overhead`.

Error = (estimate - measured) / measured, in %: **+ = overestimate**, - = underestimate.

A mapping may use setup fields or values the estimator does not accept yet (the stacks of
issue 10, the layouts of issue 12): such a case is reported "not expressible yet: needs <field>"
from the estimator's own validation error, so the benchmark completes itself as those land.
`--lenient` instead drops what is not accepted and reports what was dropped (today's estimator
on the nearest setup it can express: for before/after comparisons, not for the targets).

    PYTHONPATH=. .venv/bin/python bench/published.py            # every case
    PYTHONPATH=. .venv/bin/python bench/published.py --lenient  # today's nearest setups
    PYTHONPATH=. .venv/bin/python bench/published.py --only liger-8b-b32-off --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from estimator.document import estimate_document  # noqa: E402
from estimator.errors import EstimatorInputError  # noqa: E402
from estimator.request import EstimateRequest  # noqa: E402

DATA = ROOT / "bench" / "data" / "published_cases.json"

# Targets of issue 10, item 5 (on the cases declared expressible).
TARGET_MEDIAN_ABS_PCT = 5.0
TARGET_MAX_ABS_PCT = 12.0
TARGET_MAX_UNDER_PCT = 5.0
TARGET_MIN_EXPRESSIBLE = 30

UNIT_BYTES = {"GiB": 2**30, "MiB": 2**20, "GB": 10**9, "MB": 10**6}

COMPARED = ("allocated", "reserved", "reserved+context")


@dataclass
class CaseResult:
    """One case: `status` is `ok`, `not-yet` (needs a field the estimator does not accept yet),
    `inexpressible` (no setup can say it) or `rejected` (the estimator refused the mapping)."""

    id: str
    source: str
    status: str
    measured_bytes: float | None = None
    estimate_bytes: float | None = None
    error_pct: float | None = None
    figure: str = ""
    reason: str = ""
    dropped: list[str] = field(default_factory=list)
    approximations: list[str] = field(default_factory=list)
    note: str = ""


def load(path: Path = DATA) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = json.loads(path.read_text())
    return doc["configs"], doc["cases"]


def source_label(published: dict[str, Any]) -> str:
    """`owner/repo last-path-part` of the case's source URL (one group per table)."""
    url = str(published.get("source", ""))
    parts = url.split("github.com/")[-1].split("/")
    return f"{parts[0]}/{parts[1]} {parts[-1]}" if len(parts) > 2 else url


def measured_bytes(case: dict[str, Any]) -> float:
    """The source's figure in bytes, in the unit the mapping states."""
    unit = case["mapping"].get("unit") or case["published"]["reported_unit"]
    return float(case["published"]["reported_memory"]) * UNIT_BYTES[unit]


def model_input(mapping: dict[str, Any], configs: dict[str, Any]) -> dict[str, Any]:
    model = dict(mapping["model"])
    ref = model.pop("config_ref", None)
    if ref is not None:
        model["config"] = {k: v for k, v in configs[ref].items() if not k.startswith("_")}
    return model


def build_request(
    mapping: dict[str, Any], configs: dict[str, Any], setup: dict[str, Any]
) -> EstimateRequest:
    return EstimateRequest.model_validate(
        {
            "model": model_input(mapping, configs),
            "setup": setup,
            "seq_lens": [mapping["seq_len"]],
            "gpus": [mapping["gpu"]],
        }
    )


def not_accepted(err: ValidationError) -> list[tuple[str, str]]:
    """(setup field, what it needs) for each setup error: an unknown field, or a value outside
    the field's accepted choices."""
    needs = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        if len(loc) >= 2 and loc[0] == "setup":
            name = loc[1]
            if e["type"] == "extra_forbidden":
                needs.append((name, name))
            else:
                needs.append((name, f"{name}={e.get('input')!r}"))
        else:
            needs.append(("", f"{'.'.join(loc) or 'request'}: {e['msg']}"))
    return needs


def _field(row: dict[str, Any], name: str) -> float | None:
    """A figure of the row's (only) GPU option, else of the row."""
    fit = row["fit"][next(iter(row["fit"]))]
    value = fit.get(name, row.get(name))
    return None if value is None else float(value)


def figure_bytes(doc: dict[str, Any], compare: str) -> float | None:
    """The estimate figure comparable with the source's counter (None: not in the document)."""
    row = doc["rows"][0]
    context = float(row["components"].get("overhead") or 0)
    if compare == "allocated":
        allocated = _field(row, "allocated_bytes")
        if allocated is not None:
            return allocated
        peak = _field(row, "peak_bytes")  # documents without allocated_bytes: allocated + context
        return None if peak is None else peak - context
    if compare not in COMPARED:
        raise ValueError(f"mapping.compare: {compare!r} is not one of {COMPARED}")
    reserved = _field(row, "reserved_bytes")
    if reserved is None:
        return None
    return reserved + (context if compare == "reserved+context" else 0.0)


def _validated(
    mapping: dict[str, Any], configs: dict[str, Any], lenient: bool
) -> tuple[EstimateRequest | None, list[str], list[str]]:
    """The request, the setup fields dropped (lenient) and what is missing (strict)."""
    setup = dict(mapping["setup"])
    dropped: list[str] = []
    while True:
        try:
            return build_request(mapping, configs, setup), dropped, []
        except ValidationError as err:
            needs = not_accepted(err)
            if not lenient or any(not name for name, _ in needs):
                return None, dropped, [what for _, what in needs]
            for name, what in needs:
                setup.pop(name, None)
                dropped.append(what)


def run_case(case: dict[str, Any], configs: dict[str, Any], lenient: bool = False) -> CaseResult:
    mapping = case["mapping"]
    result = CaseResult(
        id=case["id"],
        source=source_label(case["published"]),
        status="ok",
        measured_bytes=measured_bytes(case),
        approximations=list(mapping.get("approximations", [])),
        note=str(mapping.get("note", "")),
    )
    if "inexpressible" in mapping:
        result.status, result.reason = "inexpressible", str(mapping["inexpressible"])
        return result
    request, result.dropped, missing = _validated(mapping, configs, lenient)
    if request is None:
        result.status = "not-yet"
        result.reason = "not expressible yet: needs " + ", ".join(f"setup.{m}" for m in missing)
        return result
    try:
        doc = estimate_document(request)
    except EstimatorInputError as err:
        result.status, result.reason = "rejected", f"estimator rejects {err.field}: {err.message}"
        return result
    compare = mapping["compare"]
    value = figure_bytes(doc, compare)
    result.figure = compare
    if value is None and lenient:
        value = figure_bytes(doc, "allocated")
        result.dropped.append(f"{compare} (not in the document: allocated compared)")
        result.figure = "allocated"
    if value is None:
        result.status = "not-yet"
        result.reason = "not expressible yet: needs reserved_bytes in the estimate document"
        return result
    result.estimate_bytes = value
    assert result.measured_bytes
    result.error_pct = 100.0 * (value - result.measured_bytes) / result.measured_bytes
    return result


def run(
    only: list[str] | None = None, lenient: bool = False, path: Path = DATA
) -> list[CaseResult]:
    configs, cases = load(path)
    unknown = set(only or []) - {c["id"] for c in cases}
    if unknown:
        raise ValueError(f"--only: unknown case ids {sorted(unknown)}")
    return [run_case(c, configs, lenient) for c in cases if not only or c["id"] in only]


@dataclass(frozen=True)
class Stats:
    count: int
    median_abs_pct: float | None
    max_abs_pct: float | None
    worst_under_pct: float | None  # most negative error (None if none under)


def stats(results: list[CaseResult]) -> Stats:
    errs = [r.error_pct for r in results if r.status == "ok" and r.error_pct is not None]
    if not errs:
        return Stats(0, None, None, None)
    under = [e for e in errs if e < 0]
    return Stats(
        len(errs),
        statistics.median(abs(e) for e in errs),
        max(abs(e) for e in errs),
        min(under) if under else None,
    )


def targets(results: list[CaseResult]) -> list[tuple[str, bool]]:
    """Each target of issue 10 item 5 with whether it holds."""
    s = stats(results)
    median_ok = s.median_abs_pct is not None and s.median_abs_pct <= TARGET_MEDIAN_ABS_PCT
    max_ok = s.max_abs_pct is not None and s.max_abs_pct <= TARGET_MAX_ABS_PCT
    under_ok = s.count > 0 and (s.worst_under_pct or 0.0) >= -TARGET_MAX_UNDER_PCT
    return [
        (f"median |error| <= {TARGET_MEDIAN_ABS_PCT:g} % (is {_pct(s.median_abs_pct)})", median_ok),
        (f"max |error| <= {TARGET_MAX_ABS_PCT:g} % (is {_pct(s.max_abs_pct)})", max_ok),
        (
            f"no case under by more than {TARGET_MAX_UNDER_PCT:g} % "
            f"(worst {_pct(s.worst_under_pct, signed=True)})",
            under_ok,
        ),
        (
            f"at least {TARGET_MIN_EXPRESSIBLE} of {len(results)} expressible (is {s.count})",
            s.count >= TARGET_MIN_EXPRESSIBLE,
        ),
    ]


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def report(results: list[CaseResult], lenient: bool) -> str:
    lines = [
        "Published cases: estimate vs measured, per device, GiB (2^30 bytes).",
        "error = (estimate - measured) / measured: + = overestimate, - = underestimate.",
        "Mode: "
        + (
            "LENIENT (fields the estimator does not accept were dropped; not for the targets)"
            if lenient
            else "strict (the mapping as written)"
        ),
        "",
        f"{'case':<32} {'measured':>9} {'estimate':>9} {'error':>8}  figure / status",
    ]
    for r in results:
        tail = r.figure if r.status == "ok" else r.reason
        if r.dropped:
            tail += "; dropped: " + ", ".join(r.dropped)
        lines.append(
            f"{r.id:<32} {_gib(r.measured_bytes):>9} {_gib(r.estimate_bytes):>9} "
            f"{_pct(r.error_pct, signed=True):>8}  {tail}"
        )
    lines += ["", "Per source (expressible cases):"]
    for source in dict.fromkeys(r.source for r in results):
        group = [r for r in results if r.source == source]
        s = stats(group)
        lines.append(
            f"  {source}: {s.count}/{len(group)} expressible, median |error| "
            f"{_pct(s.median_abs_pct)}, max |error| {_pct(s.max_abs_pct)}, "
            f"worst under {_pct(s.worst_under_pct, signed=True)}"
        )
    s = stats(results)
    lines.append(
        f"  all: {s.count}/{len(results)} expressible, median |error| {_pct(s.median_abs_pct)}, "
        f"max |error| {_pct(s.max_abs_pct)}"
    )
    lines += [
        "",
        "Targets (issue 10 item 5)" + (" - lenient run, not a verdict:" if lenient else ":"),
    ]
    lines += [f"  [{'ok' if ok else 'MISSED'}] {text}" for text, ok in targets(results)]
    missing = [r for r in results if r.status != "ok"]
    lines += ["", f"Not expressible ({len(missing)}):"]
    lines += [f"  {r.id}: {r.reason}" for r in missing]
    off = [
        r
        for r in results
        if r.error_pct is not None
        and (abs(r.error_pct) > TARGET_MAX_ABS_PCT or r.error_pct < -TARGET_MAX_UNDER_PCT)
    ]
    if off:
        lines += ["", "Outside the targets, and why (mapping note):"]
        lines += [f"  {r.id} ({_pct(r.error_pct, signed=True)}): {r.note or '-'}" for r in off]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated case ids")
    parser.add_argument("--lenient", action="store_true", help="drop what is not accepted yet")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed (strict mode)"
    )
    args = parser.parse_args(argv)
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    try:
        results = run(only, lenient=args.lenient)
    except ValueError as err:
        parser.error(str(err))  # exit 2
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        print(report(results, args.lenient))
    if args.check and not args.lenient and not all(ok for _, ok in targets(results)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
