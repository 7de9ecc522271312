"""Step time under a `--parallel` layout: each device's share of the compute, the pipeline
bubble, and the layout's collectives costed per link (estimator/time/comm.py).

compute = m x FLOPs(one micro-batch of the replica) / (tp x cp x pp) / (peak x efficiency)
          x (1 + bubble)     bubble (pp - 1) / m for 1F1B and GPipe, (pp - 1) / (v m) for
                             interleaved 1F1B (estimator/parallel/schedule.py; Narayanan et
                             al. 2021, sections 2.2.1-2.2.2)
step    = max(compute, memory) + offload + exposed communication
Communication per step (per device; f = its share of the model, W bf16 weights, G trainable
gradients):
  DDP        all-reduce G over the replicas
  FSDP2      all-gather W in forward and again in backward (reshard_after_forward), reduce-
             scatter G in reduce_dtype; HSDP adds an all-reduce of the shard over the replicas
  ZeRO-1/2   reduce-scatter G, all-gather the updated W (ZeRO paper section 7.2.1)
  ZeRO-3     all-gather W twice, reduce-scatter G (section 7.2.2)
  tp         per layer and micro-batch 4 all-reduces of s x b x h activations (2 forward, 2
             backward; Megatron-LM, Shoeybi et al. 2019 section 3), 2 more when the forward is
             recomputed; sequence parallelism swaps each for an all-gather + reduce-scatter of
             the same bus volume (Korthikanti et al. 2022 section 4.2.2); on the critical path
  cp         per layer: K and V passed around the ring in forward, again with dK, dV in backward
  pp         one activation and one gradient per micro-batch to the next stage, v times as
             many under interleaved 1F1B (one per chunk boundary)
  ep         per MoE layer: dispatch and combine all-to-alls in forward and backward
Collectives other than tp and ep are overlapped with compute by `comm_overlap_fraction`.
Optimizer offload (zero1/2/3 + `--offload optimizer|params`, FSDP2 CPUOffloadPolicy): besides
the host transfers, the optimizer steps on the CPU after the backward, not overlapped with the
GPU (ZeRO-Offload, Ren et al. 2021, section 4.1: the CPU update runs between the backward and
the next forward unless the one-step delayed update is on, which DeepSpeed leaves off).
DeepSpeed's CPU-Adam (csrc/adam/cpu_adam_impl.cpp Step_1/Step_4 -> cpu_adam.h Step_AVX,
deepspeedai/DeepSpeed@edaa7221) streams each element once: loads grad, exp_avg, exp_avg_sq and
the fp32 param, about ten AVX-512/AVX2 multiply/FMA/sqrt/div lanes of arithmetic, stores param,
exp_avg and exp_avg_sq, OpenMP over the host's cores (`#pragma omp parallel for`). At a few
flops per 28 bytes the step is bound by host memory bandwidth, not by the AVX rate, so
  cpu step = partition x optimizer bytes/param x ranks per node / host memory bandwidth
with the optimizer's bytes per parameter from `optimizer_traffic_bytes_per_param` (AdamW 30:
the same reads and writes, plus the bf16 copy read back for the device) and the node's host
bandwidth `host_memory_bandwidth_bytes_per_s` (an assumption, stated in the profile); every
rank of a node steps its own partition at once on the shared host memory.
"""

from __future__ import annotations

import dataclasses

from estimator.dtypes import BF16
from estimator.errors import EstimatorInputError
from estimator.parallel.data import reduce_bytes
from estimator.parallel.layout import Layout
from estimator.parallel.schedule import boundary_sends
from estimator.parallel.schedule import bubble as pipeline_bubble
from estimator.parallel.split import micro_batches, stages
from estimator.scenario import Scenario
from estimator.time.comm import Collective, Links, cost, strides
from estimator.time.flops import CHECKPOINTED, step_flops
from estimator.time.step import (
    StepTime,
    _rate,
    efficiency_for,
    memory_bytes,
    peak_flops,
    trainable_params,
    weight_bytes,
)


def collectives(sc: Scenario, layout: Layout, share: float) -> list[Collective]:
    """The layout's collectives for one step of one device (module docstring)."""
    spec, setup, profile = sc.spec, sc.setup, sc.profile
    m = micro_batches(layout, setup.grad_accum) if layout.pp > 1 else 1
    st = strides(layout)
    weights = weight_bytes(spec, setup, profile) * share
    grad_b = float(profile.number("time", "grad_comm_bytes_per_param"))
    trainable = trainable_params(spec, setup) * share
    n = layout.shard * layout.cp
    out: list[Collective] = []
    if layout.data == "dp":
        out.append(
            Collective(
                "ddp grads", "all_reduce", trainable * grad_b, layout.replicate, st["replicate"], 1
            )
        )
    elif layout.data == "fsdp" or layout.data == "zero3":
        gathers = 2 if (layout.reshard_after_forward or layout.data == "zero3") else 1
        red = reduce_bytes(setup) if layout.data == "fsdp" else grad_b
        out += [
            Collective("all-gather params", "all_gather", weights, n, st["cp"], gathers * m),
            Collective("reduce-scatter grads", "reduce_scatter", trainable * red, n, st["cp"], m),
            Collective(
                "replica all-reduce",
                "all_reduce",
                trainable * red / n,
                layout.replicate,
                st["replicate"],
                1,
            ),
        ]
    else:
        out += [
            Collective(
                "reduce-scatter grads", "reduce_scatter", trainable * grad_b, n, st["cp"], 1
            ),
            Collective("all-gather params", "all_gather", trainable * BF16, n, st["cp"], 1),
        ]
    out += _model_parallel(sc, layout, m)
    return out


def _model_parallel(sc: Scenario, layout: Layout, m: int) -> list[Collective]:
    spec, setup = sc.spec, sc.setup
    st = strides(layout)
    h = spec.hidden or 0
    layers = -(-(spec.layers or 0) // layout.pp)
    tokens = -(-sc.seq_len // layout.cp) * sc.batch
    act = tokens * h * BF16
    recompute = setup.checkpointing in CHECKPOINTED
    out = [
        Collective(
            "tp activations",
            "all_reduce",
            act,
            layout.tp,
            st["tp"],
            layers * m * (6 if recompute else 4),
            exposed=True,
        ),
    ]
    kv = (spec.num_kv_heads or spec.num_heads or 0) * (spec.head_dim or 0)
    out.append(
        Collective(
            "cp K/V ring",
            "all_gather",
            sc.seq_len * sc.batch * 2 * kv * BF16,
            layout.cp,
            st["cp"],
            layers * m * 3,
        )
    )
    sends = boundary_sends(layout.schedule, m, layout.virtual) if layout.pp > 1 else 0
    out.append(Collective("pp stage boundary", "p2p", act, 2, st["pp"], sends))
    if spec.moe and layout.ep > 1:
        moe_layers = sum(1 for t in spec.mlp_types if t == "moe") / layout.pp
        out.append(
            Collective(
                "ep all-to-all",
                "all_to_all",
                act * spec.moe.experts_per_token,
                layout.ep,
                st["cp"],
                moe_layers * m * (6 if recompute else 4),
                exposed=True,
            )
        )
    return out


def layout_step_time(
    sc: Scenario,
    layout: Layout,
    host_bytes: int = 0,
    efficiency: float | None = None,
    efficiency_source: str | None = None,
) -> StepTime:
    """The step of one device under `layout` (module docstring)."""
    spec, setup, profile, seq_len, batch = sc.spec, sc.setup, sc.profile, sc.seq_len, sc.batch
    gpu = sc.require_gpu()
    if seq_len < 1 or batch < 1:
        raise EstimatorInputError("seq_len", "sequence length and batch must be positive")
    if efficiency is None:
        efficiency, efficiency_source = efficiency_for(profile, setup, gpu.id)
    m = micro_batches(layout, setup.grad_accum) if layout.pp > 1 else 1
    mp = layout.model_parallel
    one = step_flops(spec, setup, seq_len, batch)
    scale = m / mp
    flops = dataclasses.replace(
        one,
        forward=one.forward * scale,
        backward=one.backward * scale,
        recompute=one.recompute * scale,
        model_flops=one.model_flops * scale,
        parts={},
        tokens=int(one.tokens * m),
    )
    unknown: list[str] = []
    notes = list(one.notes)
    peak, peak_name = peak_flops(gpu, setup)
    peak = _rate(peak, peak_name, gpu.id, unknown)
    bw = _rate(gpu.memory_bandwidth_bytes_per_s, "memory_bandwidth_bytes_per_s", gpu.id, unknown)
    bubble = pipeline_bubble(layout.schedule, m, layout.pp, layout.virtual)
    compute = flops.total / (peak * efficiency) * (1 + bubble) if peak else None
    sharded = "none" if layout.data == "dp" else "fsdp"
    hbm = memory_bytes(spec, setup, profile, sharded, layout.shard * layout.cp)
    if layout.offload != "none":  # the optimizer steps on the host: no HBM optimizer traffic
        traffic = profile.get("time", "optimizer_traffic_bytes_per_param")
        hbm -= (
            trainable_params(spec, setup)
            * float(traffic[setup.optimizer])
            / (layout.shard * layout.cp)
        )
    mem = hbm / mp / bw if bw else None
    total = float(spec.params_total) or 1.0
    share = max(s.params for s in stages(spec, layout, setup.grad_accum)) / total
    links = Links(
        float(gpu.interconnect_bytes_per_s) if gpu.interconnect_bytes_per_s else None,
        getattr(gpu, "inter_node_bytes_per_s", None),
        getattr(gpu, "gpus_per_node", None),
    )
    c = cost(collectives(sc, layout, share), links)
    unknown += list(c.unknown)
    hidden = profile.number("time", "comm_overlap_fraction")
    comm = None
    if c.seconds is not None and c.exposed_seconds is not None:
        comm = c.exposed_seconds + (1 - hidden) * (c.seconds - c.exposed_seconds)
    offload: float | None = 0.0
    moved = float(host_bytes) + _offload_transfer(sc, layout, share)
    if moved > 0:
        link = _rate(gpu.host_link_bytes_per_s, "host_link_bytes_per_s", gpu.id, unknown)
        overlap = profile.number("time", "offload_overlap_fraction")
        offload = (1 - overlap) * 2.0 * moved / link if link else None
    if links.gpus_per_node is None and layout.gpus > 1:
        notes.append("node size not in the catalog: every card costed on the intra-node link")
    notes.append(
        f"{layout.text}: {c.volume:.3g} bytes per device per step over its links, "
        f"{c.inter_node_seconds:.3g} s bound by the inter-node link; bubble {bubble:.0%}"
        + (f" ({layout.schedule}, {m} micro-batches)" if layout.pp > 1 else "")
    )
    transfer = offload
    cpu_step = _cpu_optimizer_seconds(sc, layout, share, links.gpus_per_node)
    if cpu_step and offload is not None:
        offload += cpu_step
        notes.append(
            f"optimizer offload: CPU optimizer step {cpu_step:.3g} s per step (host memory "
            "bandwidth bound, profile host_memory_bandwidth_bytes_per_s) besides host transfers"
        )
    step = None
    if compute is not None and mem is not None and comm is not None and offload is not None:
        step = max(compute, mem) + offload + comm
    return StepTime(
        gpu_id=gpu.id,
        count=layout.gpus,
        sharding=layout.text,
        seq_len=seq_len,
        batch=batch,
        tokens_per_step=seq_len * batch * layout.data_parallel * m,
        flops=flops,
        efficiency=efficiency,
        efficiency_source=efficiency_source or "given",
        peak_flops=peak,
        compute_seconds=compute,
        memory_seconds=mem,
        offload_transfer_seconds=transfer,
        offload_seconds=offload,
        comm_transfer_seconds=c.seconds,
        comm_seconds=comm,
        step_seconds=step,
        unknown=tuple(unknown),
        notes=tuple(notes),
        comm_inter_node_seconds=c.inter_node_seconds,
    )


def _cpu_optimizer_seconds(
    sc: Scenario, layout: Layout, share: float, gpus_per_node: int | None
) -> float:
    """The optimizer step on the host under offload (module docstring); 0 without offload."""
    if layout.offload == "none":
        return 0.0
    traffic = sc.profile.get("time", "optimizer_traffic_bytes_per_param")
    host_bw = float(sc.profile.number("time", "host_memory_bandwidth_bytes_per_s"))
    per_param = float(traffic[sc.setup.optimizer])
    partition = trainable_params(sc.spec, sc.setup) * share / (layout.shard * layout.cp)
    ranks = min(gpus_per_node or layout.gpus, layout.gpus)
    return partition * per_param * ranks / host_bw


def _offload_transfer(sc: Scenario, layout: Layout, share: float) -> float:
    """Bytes to the host and back per step under ZeRO / FSDP offload: the gradient shard out
    (bf16) and the updated parameter shard back (ZeRO-Offload, Ren et al. 2021, section 4)."""
    if layout.offload == "none":
        return 0.0
    n = layout.shard * layout.cp
    return trainable_params(sc.spec, sc.setup) * share * BF16 / n
