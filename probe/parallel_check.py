"""Per-rank peak memory of real sharded training steps on the CPU, for checking the
estimator's `--parallel` layouts (tests/estimator/parallel/test_distributed_check.py).

    torchrun --standalone --nproc-per-node 2 -m probe.parallel_check \
        --config tiny.json --layout fsdp --seq 256 --out peaks.json

Layouts: `dp` (torch DistributedDataParallel), `fsdp` (FSDP2 `fully_shard` per decoder layer,
then the root), `tp` (DTensor tensor parallelism: q/k/v/gate/up column-wise, o/down row-wise,
the embedding row-wise and the lm_head column-wise with a vocab-parallel loss). fp32
throughout, torch AdamW, full loss, no checkpointing: the estimator's `--stack probe
--precision fp32` setup.

Peaks come from the CPU allocator itself: torch.profiler with `profile_memory=True` records
every allocation and free of c10's CPU allocator (storage resizes included, so FSDP2's freeing
of all-gathered parameters is seen, and DDP's C++ buckets too); the running sum from before the
model is built, maximised over the training steps, is the rank's peak. Buffers gloo keeps
outside c10 are not counted (as NCCL's are outside torch's CUDA allocator).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from probe.distributed import decoder_layers, shard_fsdp2

__all__ = ["main", "SETUP"]

# the estimator's `--stack probe --method full --precision fp32 --checkpointing none --loss full`
SETUP: dict[str, Any] = {
    "method": "full",
    "precision": "fp32",
    "checkpointing": "none",
    "loss": "full",
    "optimizer": "adamw",
    "batch": 1,
    "attention": "sdpa",
    "stack": "probe",
    "lora_rank": 16,
    "lora_targets": ["all-linear"],
    "adapter_dtype": "fp32",
    "optimizer_impl": "foreach",
    "autocast": False,
    "lora_dropout": 0.0,
}

MARKER_BYTES = 123_457  # an allocation no training op makes: marks the first step's start


def _wrap(model: nn.Module, layout: str, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    if layout == "none" or world == 1:
        return model
    if layout == "dp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    mesh = init_device_mesh("cpu", (world,))
    decoder = getattr(model, "model", model)
    if layout == "fsdp":
        shard_fsdp2(model, decoder, mesh)
        return model
    if layout == "tp":
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        plan: dict[str, Any] = {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
        }
        for i, _ in enumerate(decoder_layers(decoder)):
            p = f"model.layers.{i}"
            for name in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "mlp.gate_proj",
                "mlp.up_proj",
            ):
                plan[f"{p}.{name}"] = ColwiseParallel()
            for name in ("self_attn.o_proj", "mlp.down_proj"):
                plan[f"{p}.{name}"] = RowwiseParallel()
        parallelize_module(model, mesh, plan)
        return model
    raise SystemExit(f"--layout: {layout!r} is not dp, fsdp or tp")


def _loss(model: nn.Module, layout: str, ids: torch.Tensor) -> torch.Tensor:
    from probe.loss import full_loss

    if layout != "tp":
        return full_loss(model, ids)
    inner: Any = model
    hidden = inner.model(input_ids=ids).last_hidden_state
    logits = inner.lm_head(hidden)  # DTensor sharded over the vocabulary
    # labels shifted left with the last position ignored, so the sharded logits are never
    # sliced (a sliced DTensor's reshape would gather the whole vocabulary)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def _loss_context(layout: str) -> Any:
    """tp: the vocab-parallel loss, forward and backward (torch loss_parallel)."""
    if layout != "tp":
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _chrome_events(prof: Any) -> list[dict[str, Any]]:
    """The profile's events as its chrome trace writes them (memory events carry `Addr`)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def memory_events(trace_events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(bytes, running total) of each CPU allocation and free, in order, from a chrome trace.

    The profiler records a free only on a thread it profiles, and gloo's worker thread frees
    some collective outputs (the bytes would stay in the total for good). An allocation at an
    address still live in the running map proves that the earlier block there was freed before
    it, so that block is taken out then: each total is an upper bound that no longer grows
    with every step (notes/i12b.md measured 0.26-0.8 MB a step before)."""
    rows = [
        (float(e["ts"]), int(e["args"]["Ev Idx"]), int(e["args"]["Bytes"]), int(e["args"]["Addr"]))
        for e in trace_events
        if e.get("name") == "[memory]" and int(e.get("args", {}).get("Device Type", -1)) == 0
    ]
    rows.sort()
    live: dict[int, int] = {}
    total = 0
    out: list[tuple[int, int]] = []
    for _, _, nbytes, addr in rows:
        if nbytes > 0:
            total -= live.pop(addr, 0)  # freed on an unprofiled thread, reused now
            live[addr] = nbytes
            total += nbytes
        elif addr in live:
            total -= live.pop(addr)
        else:
            total += nbytes  # a block allocated before the profiler started
        out.append((nbytes, total))
    return out


def _peak(events: list[tuple[int, int]]) -> int:
    """The largest running total from the window's start (the first marker) on."""
    start = next(i for i, (nbytes, _) in enumerate(events) if nbytes == MARKER_BYTES)
    return max(total for _, total in events[start:])


def _mark(phase: int) -> None:
    """A tiny allocation of a size no op makes: where forward, backward and step end."""
    marker = torch.empty(MARKER_BYTES + phase, dtype=torch.uint8)
    del marker


def _trace(events: list[tuple[int, int]]) -> dict[str, int]:
    """The running total at the window's start and the largest in each phase of the steps
    (forward + loss, backward, optimizer step)."""
    names = {MARKER_BYTES + 1: "forward", MARKER_BYTES + 2: "backward", MARKER_BYTES + 3: "step"}
    start = next(i for i, (nbytes, _) in enumerate(events) if nbytes == MARKER_BYTES)
    before = events[start][1]
    phase_peak = 0
    out: dict[str, int] = {}
    for nbytes, total in events[start:]:
        phase_peak = max(phase_peak, total)
        if nbytes in names:
            out[names[nbytes]] = max(out.get(names[nbytes], 0), phase_peak)
            phase_peak = 0
    return {"at_window_start": before, "at_end": events[-1][1], **out}


def run_layout(config: dict[str, Any], layout: str, args: argparse.Namespace) -> dict[str, Any]:
    """One layout's training steps under the profiler; every rank's peak (collective)."""
    from torch.profiler import ProfilerActivity, profile

    from probe.model import build_model
    from probe.optim import make_training_optimizer

    torch.manual_seed(0)
    rank, world = dist.get_rank(), dist.get_world_size()
    gc.collect()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        built = build_model(config, SETUP | {"batch": args.batch}, "cpu")
        model = _wrap(built.model, layout, world)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_training_optimizer(SETUP, params, "cpu")
        vocab = int(config["vocab_size"])
        gc.collect()
        dist.barrier()
        for step in range(args.steps):
            ids = torch.randint(0, vocab, (args.batch, args.seq))
            if step == 0:
                _mark(0)  # the window starts here
            with _loss_context(layout):
                loss = _loss(model, layout, ids)
                _mark(1)
                loss.backward()
            del loss, ids
            gc.collect()  # reference cycles freed now, not at a random later moment
            _mark(2)
            optimizer.step()
            _mark(3)
            optimizer.zero_grad(set_to_none=True)
            gc.collect()
        dist.barrier()
    events = memory_events(_chrome_events(prof))
    peak = _peak(events)
    # DDP's reducer must go before its process group (its destructor waits on gloo)
    del model, optimizer, params, built
    gc.collect()
    mine = {"rank": rank, "peak_bytes": peak, "trace": _trace(events)}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return {"layout": layout, "world_size": world, "seq_len": args.seq, "ranks": gathered}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    dist.init_process_group(backend="gloo")
    try:
        return [run_layout(config, layout, args) for layout in args.layout.split(",")]
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m probe.parallel_check")
    p.add_argument("--config", required=True)
    p.add_argument("--layout", required=True, help="comma list of none, dp, fsdp, tp")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--stack-dump-after", type=float, default=0, help="debug: dump stacks (s)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.stack_dump_after:
        import faulthandler

        faulthandler.dump_traceback_later(args.stack_dump_after, exit=True)
    with contextlib.redirect_stdout(sys.stderr):
        doc = run(args)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
