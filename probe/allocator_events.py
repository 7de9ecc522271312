"""Allocation traces: the event sequence the allocator simulation (`probe.allocator`) replays.

A trace is a list of events in program order:

- `alloc <id> <bytes>`: a tensor storage of `bytes` bytes is created (the caller's `nbytes`,
  not rounded: the simulation rounds like the allocator does);
- `free <id>`: the storage with that id is released;
- `empty_cache`: `torch.cuda.empty_cache()` (release every cached unsplit segment);
- `reset_peak`: `torch.cuda.reset_peak_memory_stats()` (peaks restart at the current values).

On disk a trace is JSON Lines (one object per line: `{"op": "alloc", "id": 3, "size": 4096}`,
`{"op": "free", "id": 3}`, `{"op": "empty_cache"}`), a JSON array of such objects, or plain text
lines `alloc 3 4096` / `free 3` (blank lines and `#` comments ignored). Ids are ints or strings.
Stdlib only, so the probe stays copyable to a bare GPU machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["Event", "TraceError", "alloc", "free", "parse_events", "load_trace", "dump_jsonl"]

Op = Literal["alloc", "free", "empty_cache", "reset_peak"]
OPS: tuple[str, ...] = ("alloc", "free", "empty_cache", "reset_peak")
EventId = int | str


class TraceError(ValueError):
    """A malformed trace; `field` names what was wrong (e.g. `events[3].size`)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True, slots=True)
class Event:
    """One step of a trace (see the module docstring)."""

    op: Op
    id: EventId | None = None
    size: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        if self.op in ("alloc", "free"):
            out["id"] = self.id
        if self.op == "alloc":
            out["size"] = self.size
        return out


def alloc(id_: EventId, size: int) -> Event:
    """An `alloc` event (shorthand for hand-made traces)."""
    return Event("alloc", id_, size)


def free(id_: EventId) -> Event:
    """A `free` event."""
    return Event("free", id_)


def _id(value: Any, field: str) -> EventId:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TraceError(field, f"expected an int or string id, got {value!r}")
    return value


def _size(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(field, f"expected a byte count (int >= 0), got {value!r}")
    return value


def _from_obj(obj: Any, where: str) -> Event:
    if not isinstance(obj, dict):
        raise TraceError(where, f"expected an object, got {type(obj).__name__}")
    op = obj.get("op")
    if op not in OPS:
        raise TraceError(f"{where}.op", f"must be one of {', '.join(OPS)}; got {op!r}")
    if op == "alloc":
        size = _size(obj.get("size"), f"{where}.size")
        return Event("alloc", _id(obj.get("id"), f"{where}.id"), size)
    if op == "free":
        return Event("free", _id(obj.get("id"), f"{where}.id"))
    return Event(op)


def _from_text(line: str, where: str) -> Event:
    parts = line.split()
    op = parts[0]
    if op == "alloc" and len(parts) == 3:
        raw_id: EventId = int(parts[1]) if parts[1].lstrip("-").isdigit() else parts[1]
        if not parts[2].isdigit():
            raise TraceError(f"{where}.size", f"expected a byte count, got {parts[2]!r}")
        return Event("alloc", raw_id, int(parts[2]))
    if op == "free" and len(parts) == 2:
        return Event("free", int(parts[1]) if parts[1].lstrip("-").isdigit() else parts[1])
    if op in ("empty_cache", "reset_peak") and len(parts) == 1:
        return Event(op)  # type: ignore[arg-type]
    raise TraceError(where, f"expected 'alloc ID BYTES', 'free ID' or an op name; got {line!r}")


def parse_events(items: Iterable[Any]) -> list[Event]:
    """Events from decoded JSON objects (or `Event`s, passed through), checked field by field."""
    out: list[Event] = []
    for i, item in enumerate(items):
        out.append(item if isinstance(item, Event) else _from_obj(item, f"events[{i}]"))
    return out


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield n, line


def load_trace(path: str | Path) -> list[Event]:
    """Read a trace file (JSON array, JSON Lines or plain text; see the module docstring)."""
    text = Path(path).read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError("trace", f"not valid JSON: {exc}") from None
        return parse_events(data)
    events: list[Event] = []
    for n, line in _lines(text):
        where = f"line {n}"
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(where, f"not valid JSON: {exc}") from None
            events.append(_from_obj(obj, where))
        else:
            events.append(_from_text(line, where))
    return events


def dump_jsonl(events: Iterable[Event], path: str | Path) -> None:
    """Write a trace as JSON Lines."""
    with Path(path).open("w") as fh:
        for ev in events:
            fh.write(json.dumps(ev.to_json()) + "\n")
