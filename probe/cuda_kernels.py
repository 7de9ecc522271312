"""CUDA's choice of kernel where the CPU's differs in what it keeps alive (CPU and fake runs).

Dropout: `at::native::dropout` (aten/src/ATen/native/Dropout.cpp, torch 2.x) calls the fused
`native_dropout` only when `is_fused_kernel_acceptable`: the input is on CUDA/XPU/lazy/
privateuse1 and 0 < p < 1. On the CPU (and on the fake CPU of fake mode) it takes
`_dropout_impl` instead: a noise tensor of the input's dtype (`empty_like(input)`, then
`bernoulli_` and `div_`), which `input * noise` saves for the backward. CUDA's `native_dropout`
returns the output and a bool mask, and its backward (`native_dropout_backward`) keeps only the
mask: 1 byte per element where the CPU keeps 2 (bf16) or 4 (fp32). Within `CudaKernels`,
training-mode dropout runs `torch.native_dropout` (same op, same RNG draws per element, CPU
kernel `native_dropout_cpu`, meta kernel under fake), so CPU and fake runs keep what CUDA keeps.
`torch.dropout` called directly (not through `F.dropout`) is left alone.

Everything else runs unchanged; the substitution is recorded in `environment.substituted`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own alias

__all__ = ["CudaKernels", "SUBSTITUTED"]

SUBSTITUTED = (
    "dropout in training runs torch.native_dropout (a bool mask), the kernel CUDA picks "
    "(aten/src/ATen/native/Dropout.cpp is_fused_kernel_acceptable), instead of the CPU's "
    "composite dropout that keeps a noise tensor of the input's dtype"
)


def _fused_applies(p: float, training: bool, inplace: bool, x: Any) -> bool:
    return (
        training
        and not inplace
        and 0.0 < float(p) < 1.0
        and isinstance(x, torch.Tensor)
        and x.numel() > 0
        and not x.is_cuda
    )


class CudaKernels:
    """Within the context, `torch.nn.functional.dropout` (what `nn.Dropout` and transformers'
    modeling code call, looked up at call time) takes CUDA's fused path (see the module
    docstring). A patch of the function rather than a `TorchFunctionMode`: torch function
    modes are not active in the backward, where non-reentrant checkpointing recomputes the
    layer, and a recompute that picked the other kernel would not match the forward."""

    def __init__(self) -> None:
        self.substitutions = 0
        self._original: Any = None

    def _dropout(
        self, input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
    ) -> torch.Tensor:
        if _fused_applies(p, training, inplace, input):
            self.substitutions += 1
            return torch.native_dropout(input, float(p), True)[0]
        return self._original(input, p, training, inplace)  # type: ignore[no-any-return]

    def __enter__(self) -> CudaKernels:
        self._original = F.dropout
        F.dropout = self._dropout
        return self

    def __exit__(self, *exc: object) -> None:
        F.dropout = self._original
