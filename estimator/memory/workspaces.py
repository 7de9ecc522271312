"""cuBLAS workspaces: device memory torch hands to cuBLAS from its caching allocator.

torch gives every (cuBLAS handle, CUDA stream) pair a workspace the first time that pair runs a
matmul, allocated through the caching allocator and kept for the life of the process
(pytorch/pytorch@26a39059 aten/src/ATen/cuda/CublasHandlePool.cpp: `getCurrentCUDABlasHandle`
calls `setWorkspaceForHandle`, which allocates `getNewWorkspace()` =
`CUDACachingAllocator::get()->allocate(getChosenWorkspaceSize())` once per (handle, stream) key
and keeps it in `cublas_handle_stream_to_workspace`). So the workspaces are allocated bytes:
`torch.cuda.max_memory_allocated` and `max_memory_reserved` count them.

Handles are per thread (`DeviceThreadHandlePool`, a thread-local `PoolWindow`). A training step
runs matmuls on two threads of each device: the forward (and the optimizer step) on the
caller's thread, the backward on autograd's device thread (torch/csrc/autograd/engine.cpp: one
worker thread per device runs a CUDA graph task's backward), both on the default stream: two
workspaces per device. Their size, `parseChosenWorkspaceSize` without CUBLAS_WORKSPACE_CONFIG:
4096 * 8 * 1024 B = 32 MiB on sm90 (H100, H200), 4096 * 1024 * 2 + 16 * 1024 * 8 =
8,519,680 B on every other architecture. The profile counts the sm90 size for every card
(`memory.cublas_workspace_bytes`), an upper bound by 2 x (32 MiB - 8,519,680 B) = 47.75 MiB on
other cards. The cuBLASLt workspace (1 MiB per pair, `parseCUDABlasLtWorkspaceSize`) is
allocated only by cuBLASLt matmuls (a Linear with a bias, `gemm_and_bias`) and is left out.

Measured (tests/data/memtests/memtest_h200_2026-12-04_*.json, torch 2.11.0+cu130): without this
term the allocated estimate of the probe's full fine-tune was 64.00 MiB under at every length.

A CPU run has no cuBLAS: under `torchtitan.cpu_referee()` (comparisons with CPU steps) the term
is zero, and `compare` takes it out of a CPU memtest's estimate.
"""

from __future__ import annotations

from typing import Any

from estimator.memory import torchtitan
from estimator.profile import Profile

PART = "cublas_workspaces"  # the phase part that holds them


def workspace_bytes(profile: Profile) -> float:
    """The cuBLAS workspaces of one device over a training step, per the profile; none when
    the estimate prices a CPU referee."""
    if torchtitan.on_cpu_referee():
        return 0.0
    return profile.number("memory", "cublas_workspace_bytes")


def add_workspaces(phases: dict[str, dict[str, Any]], workspaces: float) -> None:
    """Add the workspaces to every moment of `phases` as their own part: allocated at the
    first matmul of each thread and kept through every later moment of the step."""
    if not workspaces or not phases:
        return
    first = next(iter(next(iter(phases.values())).values()), 0.0)
    value = first * 0.0 + workspaces  # a scalar or an array of the lengths' shape, shared
    for parts in phases.values():
        parts[PART] = value


def workspaces_in(phases: dict[str, dict[str, Any]] | None) -> float:
    """The workspace bytes `add_workspaces` put into `phases` (0 when none)."""
    for parts in (phases or {}).values():
        if PART in parts:
            value = parts[PART]
            return float(value if isinstance(value, float | int) else value.reshape(-1)[0])
    return 0.0
