"""Device memory NCCL holds outside torch's caching allocator (seen by nvidia-smi, not by
torch.cuda.max_memory_allocated), per communicator the layout creates.

NCCL's staging buffers are NCCL_BUFFSIZE per channel and peer (NCCL user guide, Environment
Variables, NCCL_BUFFSIZE: "default 4194304 (4 MiB)"); a ring communicator connects each rank to
two peers (send, receive). The channel count is chosen by NCCL at run time from the topology
(NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS); `ASSUMED_CHANNELS` is an assumption, stated in
every estimate that counts it, not a measured figure.
"""

from __future__ import annotations

from estimator.parallel.layout import Layout

NCCL_BUFFSIZE = 4 * 2**20  # NCCL user guide, NCCL_BUFFSIZE default
RING_PEERS = 2
ASSUMED_CHANNELS = 16  # assumption (see module docstring)


def communicators(layout: Layout) -> int:
    """Process groups with more than one rank: data (and HSDP's replica group), tp, cp, pp,
    ep."""
    groups = [layout.shard, layout.replicate, layout.tp, layout.cp, layout.pp, layout.ep]
    return sum(1 for g in groups if g > 1)


def nccl_buffer_bytes(layout: Layout) -> float:
    return float(communicators(layout) * ASSUMED_CHANNELS * RING_PEERS * NCCL_BUFFSIZE)
