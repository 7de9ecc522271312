"""Look GPUs up by id, alias or option string (``2xh200``) in the packaged catalog.

Lookups read the plain records of ``gpu_catalog.card`` (no pydantic); ``load_catalog()`` and
``list_gpus()`` return the catalog validated by the pydantic schema (``gpu_catalog.schema``,
built on first use), as the service's catalog listing and the data tests need."""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

from gpu_catalog.card import DATA_FILE, Card, load_cards
from gpu_catalog.errors import InvalidGPUOptionError, UnknownGPUError

if TYPE_CHECKING:
    from gpu_catalog.schema import GPU, Catalog

MAX_GPU_COUNT = 100_000

# "h200", "2xh200", "8 x h100-80gb", "2*H200", "2×h200"
_OPTION = re.compile(r"^(?:(?P<count>\d+)\s*[xX×*]\s*)?(?P<gpu>[A-Za-z0-9][A-Za-z0-9-]*)$")


@cache
def load_catalog() -> Catalog:
    """The catalog packaged as ``gpu_catalog/gpus.json``, validated once and cached."""
    from importlib import resources

    from gpu_catalog.schema import Catalog

    text = resources.files("gpu_catalog").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return Catalog.model_validate_json(text)


def list_gpus() -> list[GPU]:
    """All GPUs, validated, in catalog order."""
    return list(load_catalog().gpus)


def get_gpu(gpu_id: str) -> Card:
    """The card for an id or alias (case-insensitive); ``UnknownGPUError`` lists known ids."""
    cards = load_cards()
    card = cards.find(gpu_id)
    if card is None:
        raise UnknownGPUError(gpu_id, cards.ids, sorted(cards.aliases))
    return card


def parse_gpu_option(text: str) -> tuple[Card, int]:
    """Parse ``h200`` / ``2xh200`` / ``8xh100-80gb`` into (card, count), count 1..100000."""
    match = _OPTION.match(text.strip())
    if match is None:
        raise InvalidGPUOptionError(
            f"invalid GPU option {text!r}; expected ID or NxID, e.g. 'h200' or '2xh200'"
        )
    count = int(match["count"]) if match["count"] is not None else 1
    if not 1 <= count <= MAX_GPU_COUNT:
        raise InvalidGPUOptionError(
            f"invalid GPU count {count} in {text!r}; must be between 1 and {MAX_GPU_COUNT}"
        )
    return get_gpu(match["gpu"]), count
