"""GPU catalog: specs of training accelerators, each figure with its source.

>>> from gpu_catalog import get_gpu, parse_gpu_option
>>> get_gpu("h200").capacity_bytes == 143771 * 2**20
True
>>> gpu, count = parse_gpu_option("2xh200")
>>> (gpu.label, count)
('H200 141GB', 2)

Lookups return plain ``Card`` records; the pydantic schema (``GPU``, ``Catalog``) that validates
the data file is built only when one of its names is first used (issue 17: CLI start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_catalog.card import Card, load_cards
from gpu_catalog.errors import GPUCatalogError, InvalidGPUOptionError, UnknownGPUError
from gpu_catalog.lookup import MAX_GPU_COUNT, get_gpu, list_gpus, load_catalog, parse_gpu_option

if TYPE_CHECKING:
    from gpu_catalog.schema import GPU, NUMERIC_FIGURES, Catalog

_SCHEMA_NAMES = ("GPU", "NUMERIC_FIGURES", "Catalog")


def __getattr__(name: str) -> Any:
    if name in _SCHEMA_NAMES:
        from gpu_catalog import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'gpu_catalog' has no attribute {name!r}")


__all__ = [
    "GPU",
    "MAX_GPU_COUNT",
    "NUMERIC_FIGURES",
    "Card",
    "Catalog",
    "GPUCatalogError",
    "InvalidGPUOptionError",
    "UnknownGPUError",
    "get_gpu",
    "list_gpus",
    "load_cards",
    "load_catalog",
    "parse_gpu_option",
]
