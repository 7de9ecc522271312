"""Pydantic models for the GPU catalog: one ``GPU`` per card, a ``Catalog`` of them.

Units follow docs/design: bytes and bytes/s as integers, rates in TFLOP/s (dense, no 2:4
sparsity), power in W, prices in USD per GPU-hour. ``capacity_bytes`` is what the driver
reports (nvidia-smi MiB x 2^20); ``memory_marketed_gb`` is the vendor's label.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GIB = 2**30
MIB = 2**20

NonNegFloat = Annotated[float, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]

# Every numeric figure of a GPU; each non-null one needs an entry in ``GPU.sources``.
NUMERIC_FIGURES: tuple[str, ...] = (
    "memory_marketed_gb",
    "memory_reported_mib",
    "capacity_bytes",
    "bf16_dense_tflops",
    "fp8_dense_tflops",
    "fp32_tflops",
    "mamf_bf16_tflops_measured",
    "memory_bandwidth_bytes_per_s",
    "interconnect_bytes_per_s",
    "host_link_bytes_per_s",
    "gpus_per_node",
    "inter_node_bytes_per_s",
    "price_usd_per_hour",
    "tdp_w",
)


class GPU(BaseModel):
    """One accelerator SKU, with a source for every figure it states."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    name: str = Field(min_length=1)
    vendor: Literal["NVIDIA", "AMD", "generic"]  # generic: a capacity given by the user
    memory_marketed_gb: float = Field(gt=0)  # the label ("80 GB"), never a capacity
    memory_reported_mib: int | None = Field(default=None, gt=0)  # nvidia-smi memory.total
    capacity_bytes: int = Field(gt=0)  # what the driver reports, in bytes
    bf16_dense_tflops: NonNegFloat | None = None
    fp8_dense_tflops: NonNegFloat | None = None  # null where FP8 is not supported
    fp32_tflops: NonNegFloat | None = None  # non-tensor FP32
    mamf_bf16_tflops_measured: NonNegFloat | None = None  # measured matmul ceiling
    memory_bandwidth_bytes_per_s: NonNegInt | None = None
    interconnect: str | None = None
    interconnect_bytes_per_s: NonNegInt | None = None  # GPU-to-GPU, per direction
    host_link: str | None = None
    host_link_bytes_per_s: NonNegInt | None = None  # per direction, theoretical
    # nodes: GPUs that share the intra-node link (`interconnect_bytes_per_s`); beyond a node
    # traffic crosses `inter_node` (InfiniBand / RoCE / Ethernet), per GPU, per direction
    gpus_per_node: int | None = Field(default=None, ge=1)
    inter_node: str | None = None
    inter_node_bytes_per_s: NonNegInt | None = None
    price_usd_per_hour: NonNegFloat | None = None  # on-demand, per GPU
    price_source: str | None = None
    tdp_w: NonNegInt | None = None
    sources: dict[str, str] = Field(default_factory=dict)  # figure name -> source text
    notes: str | None = None

    @model_validator(mode="after")
    def _every_figure_has_a_source(self) -> GPU:
        unknown = sorted(set(self.sources) - set(NUMERIC_FIGURES))
        if unknown:
            raise ValueError(f"{self.id}: sources names unknown figures {unknown}")
        missing = [
            name
            for name in NUMERIC_FIGURES
            if getattr(self, name) is not None and not self.sources.get(name, "").strip()
        ]
        if missing:
            raise ValueError(f"{self.id}: figures without a source: {missing}")
        if self.price_usd_per_hour is not None and not (self.price_source or "").strip():
            raise ValueError(f"{self.id}: price_usd_per_hour needs a price_source")
        mib = self.memory_reported_mib
        if mib is not None and mib * MIB != self.capacity_bytes:
            raise ValueError(
                f"{self.id}: capacity_bytes {self.capacity_bytes} != memory_reported_mib "
                f"{mib} x 2^20 = {mib * MIB}"
            )
        return self

    @property
    def capacity_gib(self) -> float:
        """Driver-reported capacity in GiB (2^30 bytes)."""
        return self.capacity_bytes / GIB

    @property
    def label(self) -> str:
        """Human label with the marketed size, e.g. ``"H200 141GB"``."""
        return f"{self.name} {self.memory_marketed_gb:g}GB"


class Catalog(BaseModel):
    """All GPUs (unique ids), the id aliases and the source legend of the data file."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    about: str = Field(default="", alias="_about")
    sources: dict[str, str] = Field(default_factory=dict)  # legend: source id -> description
    aliases: dict[str, str] = Field(default_factory=dict)  # alias -> GPU id
    gpus: tuple[GPU, ...]

    @model_validator(mode="after")
    def _ids_unique_and_aliases_resolve(self) -> Catalog:
        ids = [gpu.id for gpu in self.gpus]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate GPU ids: {duplicates}")
        known = set(ids)
        for alias, target in self.aliases.items():
            if alias != alias.lower():
                raise ValueError(f"alias {alias!r} must be lower case")
            if alias in known:
                raise ValueError(f"alias {alias!r} shadows a GPU id")
            if target not in known:
                raise ValueError(f"alias {alias!r} points to unknown GPU id {target!r}")
        return self

    @property
    def ids(self) -> tuple[str, ...]:
        """GPU ids in file order."""
        return tuple(gpu.id for gpu in self.gpus)

    def find(self, gpu_id: str) -> GPU | None:
        """The GPU for an id or alias (case-insensitive), or None."""
        key = gpu_id.strip().lower()
        key = self.aliases.get(key, key)
        return next((gpu for gpu in self.gpus if gpu.id == key), None)
