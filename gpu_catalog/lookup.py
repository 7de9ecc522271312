"""Load the packaged catalog and look GPUs up by id, alias or option string (``2xh200``)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from gpu_catalog.errors import InvalidGPUOptionError, UnknownGPUError
from gpu_catalog.schema import GPU, Catalog

DATA_FILE = "gpus.json"
MAX_GPU_COUNT = 100_000

# "h200", "2xh200", "8 x h100-80gb", "2*H200", "2×h200"
_OPTION = re.compile(r"^(?:(?P<count>\d+)\s*[xX×*]\s*)?(?P<gpu>[A-Za-z0-9][A-Za-z0-9-]*)$")


@cache
def load_catalog() -> Catalog:
    """The catalog packaged as ``gpu_catalog/gpus.json``, validated once and cached."""
    text = resources.files("gpu_catalog").joinpath(DATA_FILE).read_text(encoding="utf-8")
    return Catalog.model_validate_json(text)


def list_gpus() -> list[GPU]:
    """All GPUs, in catalog order."""
    return list(load_catalog().gpus)


def get_gpu(gpu_id: str) -> GPU:
    """The GPU for an id or alias (case-insensitive); ``UnknownGPUError`` lists known ids."""
    catalog = load_catalog()
    gpu = catalog.find(gpu_id)
    if gpu is None:
        raise UnknownGPUError(gpu_id, catalog.ids, sorted(catalog.aliases))
    return gpu


def parse_gpu_option(text: str) -> tuple[GPU, int]:
    """Parse ``h200`` / ``2xh200`` / ``8xh100-80gb`` into (GPU, count), count 1..100000."""
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
