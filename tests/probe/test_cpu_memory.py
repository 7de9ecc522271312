"""probe/cpu_memory.py's counting CPU allocator under the calls that allocate through
`Allocator::raw_allocate` (oneDNN's bf16 matmul), which assert that a block's context is its
data pointer (c10/core/Allocator.h:209). Run in a subprocess: the counter, once installed, stays
in front of the process's CPU allocator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import torch
from probe.cpu_memory import CpuAllocatorCounter
c = CpuAllocatorCounter()
c.install()
before = c.current()
w = torch.randn(256, 512, dtype=torch.bfloat16)
x = torch.randn(64, 512, dtype=torch.bfloat16)
y = torch.nn.functional.linear(x, w)
y.sum().backward() if y.requires_grad else None
held = c.current() - before
del w, x, y
print(held, c.current() - before, c.peak() - before)
"""


def _run(script: str) -> list[int]:
    """Run `script` in a fresh process (the counter stays installed once it is); its printed
    integers."""
    from probe.cpu_memory import compiler_missing

    reason = compiler_missing()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(v) for v in proc.stdout.split()]


def test_bf16_linear_runs_and_every_block_is_given_back() -> None:
    held, after, peak = _run(SCRIPT)
    # w, x and y (bf16): 2 bytes each
    assert held >= 2 * (256 * 512 + 64 * 512 + 64 * 256)
    assert after == 0
    assert peak >= held


THREADS = """
import threading
import torch
from probe.cpu_memory import CpuAllocatorCounter
c = CpuAllocatorCounter()
c.install()
c.mark_thread()
c.reset_peak()
mine = torch.empty(1 << 20, dtype=torch.uint8)       # 1 MiB on the marked thread
held = []
t = threading.Thread(target=lambda: held.append(torch.empty(3 << 20, dtype=torch.uint8)))
t.start(); t.join()                                  # 3 MiB on another thread, alive
other_alive = c.other_current()
freed_elsewhere = threading.Thread(target=lambda: held.clear())
freed_elsewhere.start(); freed_elsewhere.join()      # freed on yet another thread
print(other_alive, c.other_current(), c.other_peak(), c.marked_peak(), c.peak())
"""


def test_blocks_of_unmarked_threads_are_kept_apart() -> None:
    other_alive, other_after, other_peak, marked_peak, peak = _run(THREADS)
    assert other_alive == 3 << 20
    assert other_after == 0
    assert other_peak == 3 << 20
    # the marked thread's 1 MiB (plus whatever small blocks torch made on it), never the 3 MiB
    assert 1 << 20 <= marked_peak < 2 << 20
    assert peak >= (4 << 20)
