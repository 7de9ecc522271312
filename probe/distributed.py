"""Multi-process runs under torchrun: FSDP2 sharding and per-rank peaks."""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["DistributedRun"]


class DistributedRun:
    """The process group of a torchrun launch (world size 1 when not launched by torchrun)."""

    def __init__(self, world_size: int, rank: int, device: str) -> None:
        self.world_size = world_size
        self.rank = rank
        self.device = device

    @classmethod
    def from_env(cls, device: str) -> DistributedRun:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        return cls(world, rank, device)

    def __enter__(self) -> DistributedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def shard(self, built: Any) -> None:
        raise NotImplementedError

    def gather_ranks(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def full_counts(self, built: Any) -> tuple[int, int]:
        return built.params_total, built.params_trainable


_ = torch
