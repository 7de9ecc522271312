"""What the memtest records about the machine and the libraries."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch

__all__ = ["describe_environment", "package_version", "MEMORY_COUNTERS"]

MEMORY_COUNTERS = {
    "cuda": "torch.cuda.max_memory_allocated",
    "cpu": "storage_tracker",
    "fake": "fake_storage_tracker",
}


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe_environment(device: str, gpu_count: int = 1) -> dict[str, Any]:
    """The `environment` object, without the kernel fields (the runner fills those)."""
    gpu_name: str | None = None
    total: int | None = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu_name = props.name
        total = int(props.total_memory)
    return {
        "device": device,
        "gpu_name": gpu_name,
        "total_memory_bytes": total,
        "gpu_count": gpu_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": package_version("transformers"),
        "peft": package_version("peft"),
        "bitsandbytes": package_version("bitsandbytes"),
        "memory_counter": MEMORY_COUNTERS[device],
        "attention_kernel": "unknown",
        "linear_attention_kernel": None,
    }
