"""Step time, throughput and run hours on a GPU option (one card or `N x card`).

step_seconds = max(compute, memory) + exposed offload transfer + exposed communication, where
- compute = executed FLOPs (forward + backward + recompute, `estimator.time.flops`) / (dense peak
  x efficiency). The peak is the catalog's dense bf16 rate (fp32 rate for `precision=fp32`);
  efficiency is the fraction of it achieved on executed FLOPs (it equals MFU when nothing is
  recomputed) and comes from the profile (`time.json`) or from a calibration;
- memory = bytes that must stream through HBM each step (weights once per pass, the optimizer's
  reads and writes) / memory bandwidth: a floor for small batches, activation traffic is not
  modelled (it is inside the efficiency);
- offload = checkpoints copied to the host and back (2 x host_bytes) over the host link, of
  which the profile's `offload_overlap_fraction` is hidden behind compute;
- communication = data-parallel collectives over `interconnect_bytes_per_s` with ring factors
  (N-1)/N (Patarasuk & Yuan 2009; the ZeRO paper, Rajbhandari et al. 2020, section 7), of which
  `comm_overlap_fraction` is hidden.
A rate the catalog does not know (null) is never guessed: the step time is then None and
`unknown` says which rate is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.memo import Memo, setup_key
from estimator.parallel.of_setup import layout_of
from estimator.profile import Profile
from estimator.scenario import Scenario
from estimator.spec import ModelSpec
from estimator.time.flops import CHECKPOINTED, FlopsTotals, StepFlops, step_flops

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

DATA_PARALLEL = ("fsdp", "zero1", "zero2", "zero3")


class GPULike(Protocol):
    """The catalog fields timing reads (`gpu_catalog.GPU` has them)."""

    @property
    def id(self) -> str: ...
    @property
    def bf16_dense_tflops(self) -> float | None: ...
    @property
    def memory_bandwidth_bytes_per_s(self) -> int | None: ...
    @property
    def interconnect_bytes_per_s(self) -> int | None: ...
    @property
    def host_link_bytes_per_s(self) -> int | None: ...


def effective_sharding(setup: TrainingSetup, count: int) -> str:
    """One card: no sharding. Several cards and `sharding=none`: layers split over the cards
    (`device_map`, what seed 000 calls model parallel), as `TrainingSetup` itself does."""
    if count <= 1:
        return "none"
    return "device_map" if setup.sharding == "none" else setup.sharding


def peak_flops(gpu: GPULike, setup: TrainingSetup) -> tuple[float | None, str]:
    """Dense peak FLOP/s the step runs at: bf16 tensor rate for mixed/bf16 (LoRA/QLoRA compute
    in bf16 too), the FP32 rate for `precision=fp32` (PyTorch does not use TF32 for matmuls by
    default, `torch.backends.cuda.matmul.allow_tf32 = False`)."""
    name = (
        "fp32_tflops" if setup.precision == "fp32" and not setup.is_adapter else "bf16_dense_tflops"
    )
    tflops = getattr(gpu, name, None)
    return (None if tflops is None else float(tflops) * 1e12), name


def efficiency_for(profile: Profile, setup: TrainingSetup, gpu_id: str) -> tuple[float, str]:
    """Efficiency from the profile: `efficiency.<method>` times `efficiency_scale_by_gpu[gpu]`
    (1 when absent). Returns (value, source text)."""
    key = f"efficiency.{setup.method}"
    base = profile.number("time", key)
    source = f"profile {profile.name}: time.{key} ({profile.entries['time'][key].source})"
    scales = _optional(profile, "efficiency_scale_by_gpu", {})
    if gpu_id in scales:
        scale = float(scales[gpu_id])
        src = profile.entries["time"]["efficiency_scale_by_gpu"].source
        return base * scale, f"{source} x {scale:g} for {gpu_id} ({src})"
    return base, source


def _optional(profile: Profile, key: str, default: Any) -> Any:
    try:
        return profile.get("time", key)
    except KeyError:
        return default


def trainable_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Parameters with gradients and optimizer states: all (full), the adapters (LoRA/QLoRA;
    0 for a params-only spec, whose adapters cannot be sized)."""
    if not setup.is_adapter:
        return spec.params_total
    if not spec.geometry_known:
        return 0
    return _ADAPTER_PARAMS.get((spec,), setup_key(setup), lambda: lora_params(spec, setup))


_ADAPTER_PARAMS: Memo[int] = Memo()  # per (spec, setup): the same for every row and GPU


def weight_bytes(spec: ModelSpec, setup: TrainingSetup, profile: Profile) -> float:
    """Bytes of the weights as the kernels read them: bf16 (2/param) for mixed/bf16 and for a
    LoRA base, fp32 for precision=fp32, NF4 for QLoRA's Linear weights (QLoRA paper, Dettmers et
    al. 2023, section 3: 4-bit NF4 + double-quantised constants, ~4.127 bits/param)."""
    per = profile.get("time", "weight_bytes_per_param")
    if setup.method == "qlora" and spec.geometry_known:
        linear = spec.params_linear
        return linear * float(per["nf4"]) + (spec.params_total - linear) * float(per["bf16"])
    dtype = "fp32" if setup.precision == "fp32" and not setup.is_adapter else "bf16"
    return spec.params_total * float(per[dtype])


def memory_bytes(
    spec: ModelSpec, setup: TrainingSetup, profile: Profile, sharding: str, count: int
) -> float:
    """HBM traffic floor of one step on one card: the weights once per pass (forward, backward,
    and the recomputed forward under checkpointing) plus the optimizer step's reads and writes
    (`optimizer_traffic_bytes_per_param`, counted per optimizer in time.json), divided over the
    ranks when optimizer states are sharded (ZeRO-1/2/3, FSDP)."""
    passes = 3 if setup.checkpointing in CHECKPOINTED else 2
    traffic = profile.get("time", "optimizer_traffic_bytes_per_param")
    opt = trainable_params(spec, setup) * float(traffic[setup.optimizer])
    if sharding in DATA_PARALLEL:
        opt /= count
    return passes * weight_bytes(spec, setup, profile) + opt


def comm_bytes(
    spec: ModelSpec,
    setup: TrainingSetup,
    profile: Profile,
    sharding: str,
    count: int,
    seq_len: int,
    batch: int,
) -> float:
    """Bytes each rank sends per step (ring collectives: (N-1)/N of the full buffer).

    FSDP / ZeRO-3: all-gather of the (bf16, or NF4 for QLoRA) weights in forward and again in
    backward, reduce-scatter of the trainable gradients (ZeRO paper section 7.2.2: 3x the
    parameter volume vs 2x for DDP). ZeRO-1/2: reduce-scatter of gradients and all-gather of the
    updated trainable weights (2x, section 7.2.1); a frozen LoRA base stays replicated.
    device_map: no data-parallel traffic; the layer-boundary activations (and their gradients)
    cross to the next card once per boundary: 2 x (N-1) x tokens x hidden x 2 bytes."""
    if count <= 1 or sharding == "none":
        return 0.0
    if sharding == "device_map":  # per row: nothing of the data-parallel terms below
        hidden = spec.hidden or 0
        return 2.0 * (count - 1) * seq_len * batch * hidden * 2.0
    ring = (count - 1) / count
    grad_b = float(profile.number("time", "grad_comm_bytes_per_param"))
    trainable = trainable_params(spec, setup)
    if sharding in ("fsdp", "zero3"):
        return ring * (2 * weight_bytes(spec, setup, profile) + trainable * grad_b)
    if sharding in ("zero1", "zero2"):
        return ring * trainable * (grad_b + 2.0)
    raise EstimatorInputError("setup.sharding", f"unknown sharding {sharding!r}")


@dataclass(frozen=True)
class StepTime:
    """Time of one optimizer step. `tokens_per_step` counts every rank's tokens."""

    gpu_id: str
    count: int
    sharding: str
    seq_len: int
    batch: int
    tokens_per_step: int
    flops: StepFlops
    efficiency: float
    efficiency_source: str
    peak_flops: float | None
    compute_seconds: float | None
    memory_seconds: float | None
    offload_transfer_seconds: float | None
    offload_seconds: float | None
    comm_transfer_seconds: float | None
    comm_seconds: float | None
    step_seconds: float | None
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    comm_inter_node_seconds: float | None = None  # --parallel layouts: time/comm.py

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens_per_step / self.step_seconds if self.step_seconds else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs (no recompute) per working card / (step x peak)."""
        if not self.step_seconds or not self.peak_flops:
            return None
        return self.flops.model_flops / (self.step_seconds * self.peak_flops)

    def hours(self, tokens: float | None) -> tuple[float | None, float | None]:
        """(wall hours, GPU hours) for `tokens`: tokens / tokens_per_second, x cards rented."""
        tps = self.tokens_per_second
        if tokens is None or tps is None:
            return None, None
        wall = tokens / tps / 3600.0
        return wall, wall * self.count

    def as_dict(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_step": self.tokens_per_step,
            "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "offload_seconds": self.offload_seconds,
            "offload_transfer_seconds": self.offload_transfer_seconds,
            "comm_seconds": self.comm_seconds,
            "comm_transfer_seconds": self.comm_transfer_seconds,
            "comm_inter_node_seconds": self.comm_inter_node_seconds,
            "mfu": self.mfu,
            "efficiency": self.efficiency,
            "efficiency_source": self.efficiency_source,
            "peak_flops": self.peak_flops,
            "flops_per_step": self.flops.total,
            "model_flops_per_step": self.flops.model_flops,
            "sharding": self.sharding,
            "gpus": self.count,
            "unknown": list(self.unknown),
            "notes": list(self.notes),
        }


def _rate(value: float | int | None, name: str, gpu_id: str, unknown: list[str]) -> float | None:
    if value is None or value == 0:
        unknown.append(f"unknown rate: {name} of {gpu_id} is not in the catalog")
        return None
    return float(value)


@dataclass(frozen=True)
class OptionRates:
    """What the step time of a GPU option takes that does not depend on the length: computed
    once per option (`option_rates`) and applied to every row (`step_cell`, `cell`). A setup
    with a `parallel` layout keeps its `layout` (and the efficiency it was `given`): its cells
    are `estimator.time.parallel_step.layout_step_time`'s, one at a time."""

    sc: Scenario
    gpu: GPULike
    count: int
    sharding: str
    efficiency: float
    efficiency_source: str
    peak_flops: float | None
    memory_seconds: float | None
    unknown: tuple[str, ...]
    layout: Any = None
    given: tuple[float | None, str | None] = (None, None)
    comm_volume: float | None = None  # bytes per rank per step when the tokens do not matter
    offload_hidden: float | None = None  # the profile's overlap fractions, read once
    comm_hidden: float | None = None

    @property
    def ranks(self) -> int:
        return self.count if self.sharding in DATA_PARALLEL else 1


def option_rates(
    sc: Scenario, efficiency: float | None = None, efficiency_source: str | None = None
) -> OptionRates:
    """The scenario's GPU option: sharding, efficiency (the profile's unless given), peak
    FLOP/s, and the HBM floor of a step (it depends on the weights, not on the tokens)."""
    spec, setup, profile = sc.spec, sc.setup, sc.profile
    gpu, count = sc.require_gpu(), sc.cards
    layout = layout_of(setup, count, getattr(gpu, "gpus_per_node", None))
    if layout is not None:
        given = (efficiency, efficiency_source)
        return OptionRates(sc, gpu, count, "", 0.0, "", None, None, (), layout, given)
    sharding = effective_sharding(setup, count)
    if efficiency is None:
        efficiency, efficiency_source = efficiency_for(profile, setup, gpu.id)
    if not 0 < efficiency <= 1:
        raise EstimatorInputError("efficiency", f"{efficiency} is not in (0, 1]")
    unknown: list[str] = []
    peak, peak_name = peak_flops(gpu, setup)
    peak = _rate(peak, peak_name, gpu.id, unknown)
    bw = _rate(gpu.memory_bandwidth_bytes_per_s, "memory_bandwidth_bytes_per_s", gpu.id, unknown)
    mem = memory_bytes(spec, setup, profile, sharding, count) / bw if bw else None
    # data-parallel traffic is the weights' and gradients': the same for every row
    volume = (
        None
        if sharding == "device_map"
        else comm_bytes(spec, setup, profile, sharding, count, 1, 1)
    )
    offload_hidden = comm_hidden = None
    if setup.checkpointing == "offload":
        offload_hidden = profile.number("time", "offload_overlap_fraction")
    if count > 1 and sharding != "none":
        comm_hidden = profile.number("time", "comm_overlap_fraction")
    return OptionRates(
        sc,
        gpu,
        count,
        sharding,
        efficiency,
        efficiency_source or "given",
        peak,
        mem,
        tuple(unknown),
        comm_volume=volume,
        offload_hidden=offload_hidden,
        comm_hidden=comm_hidden,
    )


class Cell(NamedTuple):
    """One row on one option, the figures the estimate document reports (`StepTime`'s)."""

    step_seconds: float | None
    tokens_per_step: int
    compute_seconds: float | None
    memory_seconds: float | None
    offload_seconds: float | None
    comm_seconds: float | None
    peak_flops: float | None
    efficiency: float
    efficiency_source: str
    flops_total: float
    model_flops: float
    cards: int  # cards rented: GPU hours = wall hours x cards
    sharding: str
    unknown: list[str]
    comm_inter_node_seconds: float | None = None  # --parallel layouts (time/comm.py)


def cell(
    r: OptionRates, flops: StepFlops | FlopsTotals, seq_len: int, batch: int, host_bytes: int
) -> Cell:
    """`step_time` of one row on the option `r`, without building a StepTime (the legacy
    sharding path); a `parallel` layout's cell is `layout_step_time`'s."""
    if r.layout is not None:
        from estimator.time.parallel_step import layout_step_time

        sc = r.sc.at(seq_len=seq_len, batch=batch)
        st = layout_step_time(sc, r.layout, host_bytes, *r.given)
        return Cell(
            st.step_seconds,
            st.tokens_per_step,
            st.compute_seconds,
            st.memory_seconds,
            st.offload_seconds,
            st.comm_seconds,
            st.peak_flops,
            st.efficiency,
            st.efficiency_source,
            st.flops.total,
            st.flops.model_flops,
            st.count,
            st.sharding,
            list(st.unknown),
            st.comm_inter_node_seconds,
        )
    compute, _, offload, _, comm, step, unknown, _ = step_cell(
        r, flops.total, seq_len, batch, host_bytes, False
    )
    return Cell(
        step,
        seq_len * batch * r.ranks,
        compute,
        r.memory_seconds,
        offload,
        comm,
        r.peak_flops,
        r.efficiency,
        r.efficiency_source,
        flops.total,
        flops.model_flops,
        r.count,
        r.sharding,
        unknown,
    )


CellTimes = tuple[
    float | None,  # compute_seconds
    float | None,  # offload_transfer_seconds
    float | None,  # offload_seconds
    float | None,  # comm_transfer_seconds
    float | None,  # comm_seconds
    float | None,  # step_seconds
    list[str],  # unknown (the option's, then this cell's)
    list[str],  # notes (offload, communication, device_map) when asked for
]


def step_cell(
    r: OptionRates, flops_total: float, seq_len: int, batch: int, host_bytes: int, notes: bool
) -> CellTimes:
    """One row on one option: compute, offload and communication seconds and the step (see the
    module docstring); None where a rate the catalog does not know is needed."""
    setup, profile, gpu, sharding = r.sc.setup, r.sc.profile, r.gpu, r.sharding
    unknown = list(r.unknown)
    said: list[str] = []
    peak = r.peak_flops
    compute = flops_total / (peak * r.efficiency) if peak else None

    offload_raw: float | None = 0.0
    offload: float | None = 0.0
    if setup.checkpointing == "offload" and host_bytes > 0:
        link = _rate(gpu.host_link_bytes_per_s, "host_link_bytes_per_s", gpu.id, unknown)
        hidden = r.offload_hidden
        if hidden is None:
            hidden = profile.number("time", "offload_overlap_fraction")
        offload_raw = 2.0 * host_bytes / link if link else None
        offload = None if offload_raw is None else (1.0 - hidden) * offload_raw
        if notes:
            said.append(f"offload: 2 x {host_bytes} bytes over the host link, {hidden:.0%} hidden")

    comm_raw: float | None = 0.0
    comm: float | None = 0.0
    volume = r.comm_volume
    if volume is None:  # device_map: the layer-boundary activations, per token
        volume = comm_bytes(r.sc.spec, setup, profile, sharding, r.count, seq_len, batch)
    if volume > 0:
        net = _rate(gpu.interconnect_bytes_per_s, "interconnect_bytes_per_s", gpu.id, unknown)
        hidden = r.comm_hidden
        if hidden is None:
            hidden = profile.number("time", "comm_overlap_fraction")
        comm_raw = volume / net if net else None
        comm = None if comm_raw is None else (1.0 - hidden) * comm_raw
        if notes:
            said.append(f"{sharding}: {volume:.3g} bytes per rank per step, {hidden:.0%} hidden")
    if notes and sharding == "device_map":
        said.append("device_map: one card computes at a time; all cards are rented")

    mem = r.memory_seconds
    step = None
    if compute is not None and mem is not None and offload is not None and comm is not None:
        step = max(compute or 0.0, mem or 0.0) + (offload or 0.0) + (comm or 0.0)
    return compute, offload_raw, offload, comm_raw, comm, step, unknown, said


def step_time(
    sc: Scenario,
    *,
    host_bytes: int = 0,
    efficiency: float | None = None,
    efficiency_source: str | None = None,
    flops: StepFlops | None = None,
) -> StepTime:
    """Step time of `batch` sequences of `seq_len` per card on `count` cards of `gpu`.

    Data parallel (fsdp/zero*): every card runs its own batch, tokens per step = count x batch x
    seq_len. device_map: one card computes at a time, so the step is one card's compute over the
    whole model and the other cards idle (they are still rented). `efficiency` overrides the
    profile (a calibration). `flops`: this row's `step_flops` when the caller has it (they do
    not depend on the GPU)."""
    seq_len, batch = sc.seq_len, sc.batch
    gpu, count = sc.require_gpu(), sc.cards
    layout = layout_of(sc.setup, count, getattr(gpu, "gpus_per_node", None))
    if layout is not None:
        from estimator.time.parallel_step import layout_step_time

        return layout_step_time(sc, layout, host_bytes, efficiency, efficiency_source)
    if seq_len < 1 or batch < 1:
        raise EstimatorInputError("seq_len", "sequence length and batch must be positive")
    if flops is None:
        flops = step_flops(sc.spec, sc.setup, seq_len, batch)
    r = option_rates(sc, efficiency, efficiency_source)
    compute, offload_raw, offload, comm_raw, comm, step, unknown, said = step_cell(
        r, flops.total, seq_len, batch, host_bytes, True
    )
    return StepTime(
        gpu_id=r.gpu.id,
        count=r.count,
        sharding=r.sharding,
        seq_len=seq_len,
        batch=batch,
        tokens_per_step=seq_len * batch * r.ranks,
        flops=flops,
        efficiency=r.efficiency,
        efficiency_source=r.efficiency_source,
        peak_flops=r.peak_flops,
        compute_seconds=compute,
        memory_seconds=r.memory_seconds,
        offload_transfer_seconds=offload_raw,
        offload_seconds=offload,
        comm_transfer_seconds=comm_raw,
        comm_seconds=comm,
        step_seconds=step,
        unknown=tuple(unknown),
        notes=(*flops.notes, *said),
    )


def gpu_days(flops: float, flops_per_second: float) -> float:
    """Days of one device at a sustained rate: flops / rate / 86400 (seed 003's arithmetic)."""
    if flops_per_second <= 0:
        raise EstimatorInputError("rate", "a sustained rate must be positive")
    return flops / flops_per_second / 86400.0
