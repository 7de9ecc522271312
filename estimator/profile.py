"""Assumption profiles: every tunable assumption, with its source, in data files.

A profile is a folder `estimator/profiles/<name>/` of JSON files, one per section
(`memory.json`, `time.json`). Each entry is `{"value": ..., "source": "..."}`. A profile may name
a `"base"` profile in `memory.json`'s top-level `_base` field: entries it does not set come from
the base.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError

SECTIONS = ("memory", "time")


@dataclass(frozen=True)
class Assumption:
    value: Any
    source: str


@dataclass(frozen=True)
class Profile:
    name: str
    entries: dict[str, dict[str, Assumption]]

    def get(self, section: str, key: str) -> Any:
        try:
            return self.entries[section][key].value
        except KeyError:
            raise KeyError(f"profile {self.name!r} has no {section}.{key}") from None

    def number(self, section: str, key: str) -> float:
        value = self.get(section, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"profile {self.name}: {section}.{key} is not a number")
        return float(value)

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Every assumption with its source, as the estimate document reports it."""
        return {
            section: {k: {"value": a.value, "source": a.source} for k, a in sorted(items.items())}
            for section, items in self.entries.items()
        }


def _profiles_root() -> Path:
    return Path(__file__).with_name("profiles")  # a path: importlib.resources costs ~5 ms


def list_profiles() -> list[str]:
    return sorted(
        p.name for p in _profiles_root().iterdir() if p.is_dir() and not p.name.startswith("_")
    )


def _read_section(name: str, section: str) -> tuple[dict[str, Assumption], str | None]:
    path = _profiles_root().joinpath(name, f"{section}.json")
    if not path.is_file():
        return {}, None
    raw = json.loads(path.read_text())
    base = raw.pop("_base", None)
    raw.pop("_about", None)
    return {k: Assumption(v["value"], v["source"]) for k, v in raw.items()}, base


@cache
def load_profile(name: str) -> Profile:
    if name not in list_profiles():
        raise EstimatorInputError(
            "profile", f"unknown profile {name!r}; known: {', '.join(list_profiles())}"
        )
    entries: dict[str, dict[str, Assumption]] = {}
    for section in SECTIONS:
        own, base = _read_section(name, section)
        merged = dict(load_profile(base).entries.get(section, {})) if base else {}
        merged.update(own)
        entries[section] = merged
    return Profile(name, entries)
