"""The catalog as the estimator reads it: plain frozen records loaded straight from
``gpus.json``, without building the pydantic schema (``gpu_catalog.schema``), which costs a
command-line run more than the whole estimate (issue 17).

The schema stays the catalog's validation: ``load_catalog()`` validates the file, the tests run
it on every change of the data, and ``tests/gpu_catalog`` checks that every ``Card`` here holds
the same values, of the same types, as the validated ``GPU``. A ``Card`` converts a figure the
way the schema does for a valid file: a whole number in a float field becomes a float."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

GIB = 2**30
DATA_FILE = "gpus.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Card:
    """One accelerator SKU: the fields of ``gpu_catalog.schema.GPU``, in its order."""

    id: str
    name: str
    vendor: str
    memory_marketed_gb: float
    memory_reported_mib: int | None = None
    capacity_bytes: int
    bf16_dense_tflops: float | None = None
    fp8_dense_tflops: float | None = None
    fp32_tflops: float | None = None
    mamf_bf16_tflops_measured: float | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    interconnect: str | None = None
    interconnect_bytes_per_s: int | None = None
    host_link: str | None = None
    host_link_bytes_per_s: int | None = None
    gpus_per_node: int | None = None
    inter_node: str | None = None
    inter_node_bytes_per_s: int | None = None
    price_usd_per_hour: float | None = None
    price_source: str | None = None
    tdp_w: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    notes: str | None = None

    @property
    def capacity_gib(self) -> float:
        """Driver-reported capacity in GiB (2^30 bytes)."""
        return self.capacity_bytes / GIB

    @property
    def label(self) -> str:
        """Human label with the marketed size, e.g. ``"H200 141GB"``."""
        return f"{self.name} {self.memory_marketed_gb:g}GB"


# the schema's float fields: JSON's 80 is the schema's 80.0
FLOAT_FIELDS = frozenset(f.name for f in fields(Card) if f.type in ("float", "float | None"))


def card_of(record: dict[str, Any]) -> Card:
    """A ``Card`` of one ``gpus`` record of the data file (a valid one: see the module note)."""
    values: dict[str, Any] = {
        k: float(v) if k in FLOAT_FIELDS and v is not None else v for k, v in record.items()
    }
    return Card(**values)


@dataclass(frozen=True)
class Cards:
    """Every card in file order, and the aliases (alias -> GPU id)."""

    cards: tuple[Card, ...]
    aliases: dict[str, str]

    @property
    def ids(self) -> tuple[str, ...]:
        """GPU ids in file order."""
        return tuple(card.id for card in self.cards)

    def find(self, gpu_id: str) -> Card | None:
        """The card for an id or alias (case-insensitive), or None (``Catalog.find``'s rule)."""
        key = gpu_id.strip().lower()
        key = self.aliases.get(key, key)
        return next((card for card in self.cards if card.id == key), None)


@cache
def load_cards() -> Cards:
    """The packaged ``gpus.json`` read once per process (package data: it does not change
    under a running process)."""
    raw = json.loads(Path(__file__).with_name(DATA_FILE).read_text(encoding="utf-8"))
    return Cards(tuple(card_of(r) for r in raw["gpus"]), dict(raw.get("aliases", {})))
