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


# CUDA's total (torch.cuda.get_device_properties().total_memory, cudaMemGetInfo) is below the
# driver-reported figure of `nvidia-smi` that the catalog keeps: 150,109,880,320 B = 143,156 MiB
# on the H200 of tests/data/memtests/ (driver 580.159.04) against 143,771 MiB, 0.43 % below.
# A card matches a CUDA total up to this fraction below its reported MiB (and never above it).
CUDA_TOTAL_BELOW_REPORTED = 0.02


def card_for_device(gpu_name: str, total_memory_bytes: int) -> str | None:
    """The catalog id of the card a CUDA run reported (`torch.cuda.get_device_name()` and its
    total memory): its reported MiB must hold the CUDA total within CUDA_TOTAL_BELOW_REPORTED;
    among several, the one with the most words of its name in the device's name ("A100 80GB":
    a100, 80gb); a PCIe entry only when the device's name says PCIe ("NVIDIA H100 80GB HBM3" is
    the SXM part). None when nothing matches or two cards match equally well."""
    mib = total_memory_bytes / 2**20
    device = re.sub(r"[^a-z0-9]", "", gpu_name.lower())
    scored: list[tuple[int, str]] = []
    for gpu in load_catalog().gpus:
        reported = gpu.memory_reported_mib or gpu.capacity_bytes / 2**20
        if not reported * (1 - CUDA_TOTAL_BELOW_REPORTED) <= mib <= reported:
            continue
        words = [w for w in re.split(r"[^a-z0-9]+", gpu.name.lower()) if w]
        if "pcie" in words and "pcie" not in device:
            continue  # the PCIe parts say so ("NVIDIA H100 PCIe"); SXM ones often do not
        scored.append((sum(1 for w in words if w in device), gpu.id))
    scored.sort(reverse=True)
    if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
        return None
    return scored[0][1]
