"""Multi-process runs under torchrun: FSDP2 sharding and per-rank peaks.

`torchrun --nproc-per-node N -m probe ...` starts N processes; each builds the model, shards every
decoder layer and then the whole model with FSDP2 (`torch.distributed.fsdp.fully_shard`), runs
the same sweep on its own random batch and measures its own peak. Rank 0 writes the memtest with
every rank's peak per length in `ranks`. CUDA uses NCCL (one GPU per process, `LOCAL_RANK`), the
CPU uses gloo.

Limit on the CPU: FSDP2 frees all-gathered parameters by resizing their storage to zero, which is
not an op the storage tracker sees, so CPU per-rank peaks over-count unsharded parameters; CUDA
peaks come from the allocator and are exact.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from probe.options import ProbeInputError

__all__ = ["DistributedRun", "decoder_layers", "shard_fsdp2"]


class DistributedRun:
    """The process group of a torchrun launch (world size 1 when not launched by torchrun)."""

    def __init__(self, world_size: int, rank: int, local_rank: int, device: str) -> None:
        self.world_size = world_size
        self.rank = rank
        self.local_rank = local_rank
        self.device = device
        self._owns_group = False

    @classmethod
    def from_env(cls, device: str) -> DistributedRun:
        """Read torchrun's WORLD_SIZE / RANK / LOCAL_RANK."""
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local = int(os.environ.get("LOCAL_RANK", "0"))
        except ValueError:
            raise ProbeInputError("WORLD_SIZE", "torchrun variables must be integers") from None
        return cls(world, rank, local, device)

    def __enter__(self) -> DistributedRun:
        import torch.distributed as dist

        if self.device == "fake":
            raise ProbeInputError("device", "multi-process runs need cuda or cpu, not fake")
        if self.device == "cuda":
            torch.cuda.set_device(self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device == "cuda" else "gloo")
            self._owns_group = True
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

    def shard(self, built: Any) -> None:
        """FSDP2: each decoder layer is one unit, the rest of the model the root unit."""
        from torch.distributed.device_mesh import init_device_mesh

        shard_fsdp2(built.model, built.decoder, init_device_mesh(self.device, (self.world_size,)))

    def gather_ranks(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every rank's peak per length, in rank order (collective: all ranks call it)."""
        import torch.distributed as dist

        mine = [
            {
                "rank": self.rank,
                "seq_len": r["seq_len"],
                "peak_allocated_bytes": r["peak_allocated_bytes"],
                "peak_reserved_bytes": r["peak_reserved_bytes"],
            }
            for r in results
        ]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return [entry for rank_entries in gathered for entry in rank_entries]

    def full_counts(self, built: Any) -> tuple[int, int]:
        """Parameter counts of the whole model (counted before sharding)."""
        return built.params_total, built.params_trainable


def shard_fsdp2(model: nn.Module, decoder: nn.Module, mesh: Any) -> None:
    """FSDP2 as HF's default wrapping does it: each decoder layer one unit, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(decoder):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def decoder_layers(decoder: nn.Module) -> list[nn.Module]:
    for name in ("layers", "h", "blocks"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, nn.ModuleList):
            return list(layers)
    return []
