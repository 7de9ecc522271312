"""Exact CPU tensor memory of a process, every thread included: a counting wrapper put in front
of c10's CPU allocator (probe/native/cpu_alloc_counter.cpp, loaded with ctypes).

Every block `c10::GetCPUAllocator()` hands out after `install()` is added when it is made and
taken off when it is freed, on whichever thread frees it, storage resizes included (FSDP2's
`untyped_storage().resize_(0)` of all-gathered parameters). torch.profiler's memory events
cannot give this under gloo: c10's reporter (c10/core/CPUAllocator.cpp,
`ProfiledCPUMemoryReporter::Delete`) records a free only on a thread the profiler is enabled on,
and a collective's tensors are often released last by gloo's worker thread (the
`AsyncWork` that holds them is dropped there), so their bytes stayed in the profiler's running
total (notes/i12r.md: DDP's broadcast of the parameters at construction, 13.6 MB on rank 0).

`paused()` hands blocks out uncounted (and their frees stay uncounted), process-wide: for the
temporaries a collective backend makes while it is called (probe/parallel_check.py).

The library is compiled once per torch version and source into a cache folder with the system
C++ compiler against torch's own headers (`compiler_missing()` says why it cannot be). Buffers
that gloo allocates itself (outside c10) are not counted, as NCCL's are outside torch's CUDA
caching allocator.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["CpuAllocatorCounter", "compiler_missing", "library_path"]

SOURCE = Path(__file__).resolve().parent / "native" / "cpu_alloc_counter.cpp"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def compiler_missing() -> str | None:
    """Why the counter cannot be built here, or None."""
    if _compiler() is None:
        return "no C++ compiler (g++ / c++ / $CXX) to build the CPU allocator counter"
    if not (Path(torch.__file__).parent / "include" / "c10" / "core" / "CPUAllocator.h").exists():
        return "this torch install has no C++ headers (torch/include)"
    return None


def library_path() -> Path:
    """The compiled counter for this torch and source (built on first use; safe under torchrun:
    each process builds into its own temporary file and renames it into place)."""
    torch_dir = Path(torch.__file__).parent
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trainfit"
    target = cache / f"cpu_alloc_counter-{key}.so"
    if target.exists():
        return target
    reason = compiler_missing()
    if reason:
        raise RuntimeError(reason)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: the temporary folder instead
        cache = Path(tempfile.gettempdir()) / "trainfit"
        target = cache / target.name
        if target.exists():
            return target
        cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib = torch_dir / "lib"
    cmd = [
        str(_compiler()),
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{torch_dir / 'include'}",
        str(SOURCE),
        f"-L{lib}",
        "-lc10",
        f"-Wl,-rpath,{lib}",
        "-o",
        tmp,
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


class CpuAllocatorCounter:
    """Bytes of c10 CPU blocks alive now, and the largest since the last `reset_peak`."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(str(library_path()))
        for name in (
            "trainfit_current",
            "trainfit_peak",
            "trainfit_reset_peak",
            "trainfit_allocs",
            "trainfit_uncounted",
            "trainfit_other_current",
            "trainfit_other_peak",
            "trainfit_marked_peak",
        ):
            getattr(self._lib, name).restype = ctypes.c_int64
        self._lib.trainfit_pause.argtypes = [ctypes.c_int]
        self._lib.trainfit_install.restype = ctypes.c_int

    def install(self) -> None:
        """Count every CPU block allocated from now on (idempotent)."""
        if self._lib.trainfit_install() < 0:
            raise RuntimeError("another CPU allocator outranks the counter")

    def current(self) -> int:
        return int(self._lib.trainfit_current())

    def peak(self) -> int:
        return int(self._lib.trainfit_peak())

    def reset_peak(self) -> int:
        """Start a new window at the bytes alive now; the previous window's peak."""
        return int(self._lib.trainfit_reset_peak())

    def mark_thread(self) -> None:
        """Keep blocks allocated on other threads than this one (and the others marked) apart
        from now on: `other_current`, `other_peak`, `marked_peak`."""
        self._lib.trainfit_mark_thread()

    def other_current(self) -> int:
        """Bytes alive now that unmarked threads allocated (0 until a thread is marked)."""
        return int(self._lib.trainfit_other_current())

    def other_peak(self) -> int:
        """The most bytes allocated on unmarked threads alive at once in this window."""
        return int(self._lib.trainfit_other_peak())

    def marked_peak(self) -> int:
        """This window's peak of the bytes allocated on marked threads (freed anywhere)."""
        return int(self._lib.trainfit_marked_peak())

    def allocations(self) -> int:
        return int(self._lib.trainfit_allocs())

    def uncounted(self) -> int:
        """Bytes allocated while paused, a running total."""
        return int(self._lib.trainfit_uncounted())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Blocks allocated inside are neither counted nor, when freed, taken off (every
        thread: a switch for the whole process)."""
        self._lib.trainfit_pause(1)
        try:
            yield
        finally:
            self._lib.trainfit_pause(0)
