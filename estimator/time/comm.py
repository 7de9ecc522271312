"""Collectives of a `--parallel` layout, costed per link they cross.

NCCL's bandwidth terms (NCCL tests, doc/PERFORMANCE.md "Bus bandwidth"): a collective of S
bytes over n ranks moves, on each rank's busiest link, S x factor where the factor is
2(n-1)/n for all-reduce and (n-1)/n for all-gather, reduce-scatter and all-to-all ("busBw =
algBw x factor"); a point-to-point send moves S once. The ring (Patarasuk & Yuan 2009) is the
bandwidth-optimal schedule NCCL uses for large messages.

Per link: ranks are numbered tp fastest, then cp, then the data-parallel shards, the replicas
and pp (Megatron-LM parallel_state.py order "tp-cp-ep-dp-pp"; torchtitan's device mesh puts tp
innermost), so a group of n ranks at stride d has min(n, gpus_per_node // d) members per node.
Inside a node every hop runs over the intra-node link (`interconnect_bytes_per_s`, NVLink /
PCIe). A group spanning k nodes has l = n / k members per node; its node-crossing ring hops run
in parallel over the members' own NICs (one NIC per GPU on DGX/HGX nodes, the catalog's
`inter_node_bytes_per_s` each), so they carry S x factor over l x inter-node bandwidth. Both
kinds of hop run at once in a ring pipeline: the collective takes the slower of the two, and
the inter-node share is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.parallel.layout import Layout


def bus_factor(kind: str, n: int) -> float:
    """Bytes over each rank's busiest link per byte of buffer (NCCL's busBw / algBw)."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # p2p


@dataclass(frozen=True)
class Links:
    """Per GPU, per direction (bytes/s); None when the catalog does not know."""

    intra: float | None
    inter: float | None
    gpus_per_node: int | None


@dataclass(frozen=True)
class Collective:
    """`count` collectives of `kind` over `group` ranks at rank distance `stride`, each of
    `size` bytes (the full buffer as NCCL counts it). `exposed`: on the critical path (tensor
    parallelism), not hidden behind compute."""

    name: str
    kind: str
    size: float
    group: int
    stride: int
    count: float
    exposed: bool = False


@dataclass(frozen=True)
class CommCost:
    seconds: float | None  # the collectives' time (max of intra / inter per collective)
    inter_node_seconds: float  # the part bound by the inter-node link
    exposed_seconds: float | None  # of `seconds`, the part that cannot overlap compute
    volume: float  # bytes per rank over its busiest link
    unknown: tuple[str, ...] = ()


def members_per_node(group: int, stride: int, gpus_per_node: int | None) -> int:
    """How many of a group's ranks share a node."""
    if not gpus_per_node or group <= 1:
        return group
    return max(1, min(group, gpus_per_node // stride)) if stride <= gpus_per_node else 1


def collective_seconds(c: Collective, links: Links) -> tuple[float | None, float]:
    """(seconds, inter-node seconds) of `c`, or (None, 0) when a needed rate is unknown."""
    if c.group <= 1 or c.size <= 0 or c.count <= 0:
        return 0.0, 0.0
    moved = c.size * bus_factor(c.kind, c.group) * c.count
    local = members_per_node(c.group, c.stride, links.gpus_per_node)
    intra = moved / links.intra if links.intra and local > 1 else (0.0 if local == 1 else None)
    if local >= c.group:
        return intra, 0.0
    if not links.inter:
        return None, 0.0
    inter = moved / (local * links.inter) if c.kind != "p2p" else moved / links.inter
    return max(intra or 0.0, inter), inter


def strides(layout: Layout) -> dict[str, int]:
    """Rank distance between members of each group (tp innermost, then cp, shard, replica,
    pp)."""
    return {
        "tp": 1,
        "cp": layout.tp,
        "shard": layout.tp * layout.cp,
        "replicate": layout.tp * layout.cp * layout.shard,
        "pp": layout.tp * layout.cp * layout.shard * layout.replicate,
    }


def cost(collectives: list[Collective], links: Links) -> CommCost:
    total: float | None = 0.0
    exposed: float | None = 0.0
    inter_total = 0.0
    volume = 0.0
    unknown: list[str] = []
    for c in collectives:
        seconds, inter = collective_seconds(c, links)
        volume += c.size * bus_factor(c.kind, c.group) * c.count if c.group > 1 else 0.0
        if seconds is None:
            unknown.append(f"{c.name}: the link it crosses has no rate in the catalog")
            total = exposed = None
            continue
        inter_total += inter
        if total is not None:
            total += seconds
        if exposed is not None and c.exposed:
            exposed += seconds
    return CommCost(total, inter_total, exposed, volume, tuple(unknown))
