"""`trainfit-probe --stack torchtitan --device fake --ranks N`: torchtitan's own `Trainer` traced
with fake tensors in one process, so 70 B models run through the real step in minutes.

What runs is what `--device cpu` runs (probe/torchtitan_stack.py: `Trainer.__init__` with
parallelize_llama's AC and FSDP2 units, `Trainer.train()`), with two switches a user of
torchtitan has:
- torchtitan's own dry-run communication mode, `comm.mode = "fake_backend"` (torchtitan 0.3.0
  config/configs.py:333-347; distributed/utils.py:432-451 `init_fake_mode`: torch.distributed's
  "fake" process group, `NGPU` ranks simulated, this process is rank `RANK`), so FSDP2 shards
  over N ranks and its collectives return without moving data;
- `debug.seed` set (0): with a seed, `set_determinism` needs no broadcast of rank 0's RNG state
  (distributed/utils.py:247-264), which a fake backend cannot deliver.
Everything runs inside torch's `FakeTensorMode`; the memory is counted by `ResizeTracker` (the
storage tracker, probe/tracker.py, plus FSDP2's storage resizes). `trace_length(fake=False)`
runs the same single-process path on real CPU tensors with the same tracker: the fake-vs-CPU
equality test compares the two. What stood in only under fake tensors is `FAKE_SUBSTITUTED`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from probe.tracker import StorageTracker, _round_up

__all__ = ["FAKE_SUBSTITUTED", "ResizeTracker", "fake_environment", "trace_length"]

FAKE_SUBSTITUTED = [
    "communication: torchtitan's own dry-run mode comm.mode='fake_backend' (torchtitan 0.3.0 "
    "config/configs.py:333-347, distributed/utils.py:432-451): torch.distributed's 'fake' "
    "process group simulating NGPU ranks in one process; FSDP2 allocates its all-gather and "
    "reduce-scatter buffers as on a real run, the collectives move no data",
    "debug.seed=0: with a seed, set_determinism skips the broadcast of rank 0's RNG state "
    "(distributed/utils.py:247-264)",
    "tensors: torch FakeTensorMode (shapes, dtypes and storages, no data); the device meshes "
    "are built outside it (ParallelDims.build_mesh: DeviceMesh reads its rank table's values)",
    "weights init: torch.nn.init's truncated normal draws normal_ only (its rejection loop, "
    "torch/nn/init.py:108-125, reads the values, which fake tensors do not have); same shapes",
    "scalars: a fake tensor's .item() answers 1 (torchtitan reads one, the valid-token count "
    "for a log line, trainer.py:893) and metrics logging is off (should_log False: the first "
    "step's log reads the loss and the gradient norm)",
    "device: the Trainer's device is 'cpu' rather than 'cpu:0' (fake tensors keep the index "
    "that real CPU tensors drop, and refuse to mix the two)",
]


class ResizeTracker(StorageTracker):  # type: ignore[no-untyped-call]
    """The storage tracker, plus what it cannot see as op outputs:
    - storage resizes: FSDP2 allocates and frees its unsharded parameters with
      `untyped_storage().resize_()` (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:
      1066-1075 alloc_storage / free_storage), which is no dispatched op; as torch's own
      MemTracker does (torch/distributed/_tools/mem_tracker.py:483-497), `UntypedStorage.resize_`
      is wrapped while the tracker is active and the storage's bytes follow its size;
    - tensor subclasses: an op on DTensors returns DTensors (the dispatch mode is off while the
      subclass runs its local ops), whose memory is their local tensors (`__tensor_flatten__`).
    """

    def __init__(self, cap: int | None = None, vocab: int | None = None) -> None:
        super().__init__(cap=cap, vocab=vocab)
        self._orig_resize: Any = None

    def __enter__(self) -> ResizeTracker:
        self._orig_resize = torch.UntypedStorage.resize_
        original, tracker = self._orig_resize, self

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = original(storage, size)
            tracker._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]

    def _track(self, tensor: torch.Tensor) -> None:
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            for name in names:
                inner = getattr(tensor, name)
                if isinstance(inner, torch.Tensor):
                    self._track(inner)
            return
        super()._track(tensor)

    def _resized(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        nbytes = _round_up(storage.nbytes())
        entry = self._live.get(key)
        if entry is None:
            if not nbytes:
                return
            uid = self._next_uid
            self._next_uid += 1
            self._live[key] = (uid, 0)
            weakref.finalize(storage, self._free, key, uid)
            entry = (uid, 0)
        uid, old = entry
        if old == nbytes:
            return
        self._live[key] = (uid, nbytes)
        if old:
            self.current -= old
            self._events.append((uid, -old))
        if nbytes:
            self.current += nbytes
            self._events.append((uid, nbytes))
            self.largest_allocation = max(self.largest_allocation, nbytes)
        self._note_peak()


class _FakeScalars(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """`.item()` of a fake tensor answers 1 (True, 1.0): fake tensors hold no values."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _fake_patches() -> Iterator[None]:
    """The meshes built outside the fake mode; truncated-normal init as `normal_`."""
    import torch.nn.init as init
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchtitan.distributed.parallel_dims import ParallelDims

    build_mesh = ParallelDims.build_mesh
    trunc = init._no_grad_trunc_normal_

    def real_build_mesh(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return build_mesh(self, *args, **kwargs)

    def normal(
        tensor: torch.Tensor, mean: float, std: float, a: float, b: float, generator: Any = None
    ) -> torch.Tensor:
        with torch.no_grad():
            return tensor.normal_(mean, std, generator=generator)

    ParallelDims.build_mesh = real_build_mesh
    init._no_grad_trunc_normal_ = normal
    try:
        yield
    finally:
        ParallelDims.build_mesh = build_mesh
        init._no_grad_trunc_normal_ = trunc


@contextlib.contextmanager
def _fake_ranks_env(world: int) -> Iterator[None]:
    """What comm.mode='fake_backend' reads (NGPU, RANK; LOCAL_RANK for the device)."""
    env = {"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _local(tensors: Any) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]


def trace_length(
    config: dict[str, Any], setup: dict[str, Any], seq: int, steps: int, world: int, fake: bool
) -> dict[str, Any]:
    """torchtitan's Trainer for this length under the fake backend with `world` ranks simulated
    (rank 0 traced), `steps` steps of `Trainer.train()`, counted by a ResizeTracker from the
    first step on. `fake`: inside FakeTensorMode, else on real CPU tensors. Returns the same
    raw measurement as `torchtitan_stack.measure_length` plus `seconds` (build and steps)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtitan.config import CommConfig
    from torchtitan.trainer import Trainer

    from probe.torchtitan_stack import (
        _hook_phases,
        _torchtitan_on_cpu,
        _trainer_config,
        length_result,
    )

    started = time.perf_counter()
    tracker = ResizeTracker(vocab=int(config["vocab_size"]))
    resident: dict[str, int] = {}
    ends: list[float] = []
    trace: dict[str, int] = {}

    def phase(name: str) -> None:
        trace[name] = max(trace.get(name, 0), tracker.peak)
        tracker.reset_peak()

    modes = contextlib.ExitStack()
    with _fake_ranks_env(world), _torchtitan_on_cpu(), modes:
        cfg = _trainer_config(config, setup, seq, steps)
        cfg.comm = CommConfig(mode="fake_backend")
        cfg.debug.seed = 0
        if fake:
            modes.enter_context(_fake_patches())
            modes.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            modes.enter_context(_FakeScalars())  # type: ignore[no-untyped-call]
        try:
            trainer = Trainer(cfg)
            trainer.metrics_processor.should_log = lambda step: False
            trainer.device = torch.device("cpu")
            built = time.perf_counter()
            handles = _hook_phases(trainer, resident, ends, phase, lambda: tracker.current)
            params = [p for m in trainer.model_parts for p in m.parameters()]
            buffers = [b for m in trainer.model_parts for b in m.buffers()]
            params_total = sum(p.numel() for p in params)
            gc.collect()
            with tracker:
                tracker.adopt(_local(params + buffers))
                trace["at_window_start"] = tracker.current
                tracker.reset_peak()
                tracker.begin_window()
                window = time.perf_counter()
                trainer.train()
                phase("after_steps")
                trace["at_end"] = tracker.current
            for h in handles:
                h.remove()
            trainer.close()
            del trainer, params, buffers
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        gc.collect()
    result = length_result(seq, params_total, 0, trace, resident, [window, *ends])
    result["seconds"] = {"build": built - started, "steps": time.perf_counter() - window}
    return result


def fake_environment(world: int) -> dict[str, Any]:
    """The memtest environment's additions for a fake trace."""
    return {
        "memory_counter": "storage tracker with storage resizes (probe/torchtitan_fake.py "
        "ResizeTracker) under FakeTensorMode",
        "fake_ranks": world,
    }
