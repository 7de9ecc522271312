"""Per-rank peak memory of real sharded training steps on the CPU, for checking the
estimator's `--parallel` layouts (tests/estimator/parallel/test_distributed_check.py).

    torchrun --standalone --nproc-per-node 2 -m probe.parallel_check \
        --config tiny.json --layout fsdp --seq 256 --out peaks.json

Layouts: `dp` (torch DistributedDataParallel), `fsdp` (FSDP2 `fully_shard` per decoder layer,
then the root), `tp` (DTensor tensor parallelism: q/k/v/gate/up column-wise, o/down row-wise,
the embedding row-wise and the lm_head column-wise with a vocab-parallel loss). fp32
throughout, torch AdamW, full loss, no checkpointing: the estimator's `--stack probe
--precision fp32` setup.

Peaks come from the CPU allocator itself: a counting wrapper in front of c10's CPU allocator
(probe/cpu_memory.py) adds every block when it is made and takes it off when it is freed, on
any thread (gloo's workers included) and through storage resizes (FSDP2's freeing of
all-gathered parameters); the bytes alive above what was alive before the model was built,
maximised over the training steps, are the rank's peak. Buffers gloo keeps outside c10 are not
counted (as NCCL's are outside torch's CUDA allocator).

gloo on the CPU, unlike NCCL on a GPU, also makes c10 temporaries of its own: `_allgather_base`
gathers into a flat output of the whole size and copies it out, `_reduce_scatter_base` clones its
whole input and all-reduces the clone (ProcessGroupGloo.cpp reduce_scatter_tensor_coalesced:
`inputTensors[i].clone()`), and the clone lives until gloo's worker drops the work, a moment that
depends on thread timing (FSDP2 ranks read up to 1.4 MB apart, notes/i12r.md). The counter is
paused while a c10d collective runs (`_BackendTemporariesUncounted`), so these are left out as
NCCL's buffers are; the bytes left out are reported per rank (`gloo_temporaries_uncounted`).
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
from torch.utils._python_dispatch import TorchDispatchMode

from probe.cpu_memory import CpuAllocatorCounter
from probe.distributed import decoder_layers, shard_fsdp2

__all__ = ["main", "run_layout", "SETUP"]

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


def _optimizer(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """SETUP's AdamW with `foreach`, torch's default on CUDA, plain tensors and DTensors alike
    (torch 2.13 optim/optimizer.py:178-185 picks foreach when every parameter's device has
    foreach kernels, utils/_foreach_utils.py:8-10: cuda, xpu, mtia; distributed/tensor/
    __init__.py:74-75 adds DTensor to the supported types). On the CPU torch would default to
    the for-loop path, whose temporaries are one tensor's instead of the group's
    `exp_avg_sq.sqrt()` (optim/adam.py:760-762) that the estimate counts. The tp plan leaves
    the RMSNorm weights plain tensors, and one foreach call cannot mix them with DTensors
    (DTensor's dispatch refuses), so they step in a second parameter group: the group-sized
    buffer is then the DTensors' (all but 2.3k of 3.4M parameters here)."""
    from torch.distributed.tensor import DTensor

    from probe.optim import LR

    dtensors = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    groups = [{"params": g} for g in (dtensors, plain) if g]
    return torch.optim.AdamW(groups, lr=LR, foreach=True)


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


class _BackendTemporariesUncounted(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Pauses the counter while a c10d collective runs (`torch.ops.c10d.*`: the tensors they
    read and write are the caller's, made outside): what is allocated meanwhile is the
    backend's own, gloo's flat all-gather output and reduce-scatter input clone, which NCCL
    does not make through torch's allocator (module docstring)."""

    def __init__(self, counter: CpuAllocatorCounter) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._counter = counter

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace != "c10d":
            return func(*args, **(kwargs or {}))
        with self._counter.paused():
            return func(*args, **(kwargs or {}))


def run_layout(
    config: dict[str, Any], layout: str, args: argparse.Namespace, counter: CpuAllocatorCounter
) -> dict[str, Any]:
    """One layout's training steps; every rank's peak and its phases (collective)."""
    from probe.model import build_model

    torch.manual_seed(0)
    rank, world = dist.get_rank(), dist.get_world_size()
    gc.collect()
    dist.barrier()
    base = counter.current()  # what earlier layouts and the process group left alive
    built = build_model(config, SETUP | {"batch": args.batch}, "cpu")
    model = _wrap(built.model, layout, world)
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(params)
    vocab = int(config["vocab_size"])
    gc.collect()
    dist.barrier()
    trace: dict[str, int] = {}

    def phase(name: str) -> None:
        trace[name] = max(trace.get(name, 0), counter.reset_peak() - base)

    uncounted = counter.uncounted()
    with _BackendTemporariesUncounted(counter):
        for step in range(args.steps):
            ids = torch.randint(0, vocab, (args.batch, args.seq))
            if step == 0:
                trace["at_window_start"] = counter.current() - base
                counter.reset_peak()  # the window starts here
            with _loss_context(layout):
                loss = _loss(model, layout, ids)
                phase("forward")
                loss.backward()  # type: ignore[no-untyped-call]
            del loss, ids
            gc.collect()  # reference cycles freed now, not at a random later moment
            phase("backward")
            optimizer.step()
            phase("step")
            optimizer.zero_grad(set_to_none=True)
            gc.collect()
    trace["gloo_temporaries_uncounted"] = counter.uncounted() - uncounted
    dist.barrier()
    phase("after_steps")
    trace["at_end"] = counter.current() - base
    phases = ("forward", "backward", "step", "after_steps")
    peak = max(trace[k] for k in phases)
    # DDP's reducer must go before its process group (its destructor waits on gloo)
    del model, optimizer, params, built
    gc.collect()
    mine = {"rank": rank, "peak_bytes": peak, "base_bytes": base, "trace": trace}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return {"layout": layout, "world_size": world, "seq_len": args.seq, "ranks": gathered}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    counter = CpuAllocatorCounter()
    counter.install()  # before the process group: every c10 CPU block from here on
    dist.init_process_group(backend="gloo")
    try:
        return [run_layout(config, layout, args, counter) for layout in args.layout.split(",")]
    finally:
        dist.barrier()  # no rank tears gloo down while another still has a collective in flight
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


def _exit_without_finalizing(rc: int) -> None:
    """Leaves without interpreter finalization: gloo's worker threads can still hold work
    objects whose tensors have Python owners, and freeing them while the interpreter is torn
    down aborts the process ("terminate called without an active exception", pytorch/pytorch
    PR 179291, issue 190489), seen here about once in ten 2-rank runs after a clean step.
    Everything the run reports is written and flushed before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    _exit_without_finalizing(main())
