"""CPU/fake runs take CUDA's fused dropout (a bool mask), not the CPU's float noise tensor."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402,N812
from torch.utils.checkpoint import checkpoint  # noqa: E402

from probe.cuda_kernels import CudaKernels  # noqa: E402


def _saved_dtypes(fn, x):
    dtypes = []

    def pack(t):
        dtypes.append(t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    return y, dtypes


def test_cpu_dropout_saves_a_noise_tensor_of_the_input_dtype_without_the_context():
    x = torch.randn(64, 32, requires_grad=True)
    _, dtypes = _saved_dtypes(lambda t: F.dropout(t, 0.1, True), x)
    assert dtypes == [torch.float32]  # the CPU's composite path: input * noise keeps noise


def test_within_the_context_dropout_saves_only_a_bool_mask_and_the_patch_is_undone():
    x = torch.randn(64, 32, requires_grad=True)
    original = F.dropout
    with CudaKernels() as kernels:
        y, dtypes = _saved_dtypes(lambda t: torch.nn.Dropout(0.1)(t), x)
        assert dtypes == [torch.bool]
        assert kernels.substitutions == 1
        y.sum().backward()
    assert F.dropout is original
    kept = (y != 0).float()
    assert torch.allclose(x.grad, kept / 0.9)  # native_dropout_backward: grad * mask * scale


def test_eval_mode_p_zero_and_inplace_dropout_are_left_alone():
    x = torch.randn(8, 8)
    with CudaKernels() as kernels:
        assert torch.equal(F.dropout(x, 0.1, training=False), x)
        assert torch.equal(F.dropout(x, 0.0, training=True), x)
        F.dropout(x.clone(), 0.1, True, inplace=True)
    assert kernels.substitutions == 0


def test_checkpoint_recompute_takes_the_same_kernel_as_the_forward():
    x = torch.randn(16, 16, requires_grad=True)
    with CudaKernels() as kernels:
        y = checkpoint(lambda t: F.dropout(t, 0.2, True) * 2, x, use_reentrant=False)
        y.sum().backward()  # a recompute on the other path would raise CheckpointError
    assert kernels.substitutions == 2  # forward and recompute
    assert torch.allclose(x.grad * 0.8 / 2, (y != 0).float())


def test_the_torchtune_stacks_cuda_run_does_not_observe_kernels_it_has_no_forward_for() -> None:
    """A TorchtuneSession has no autocast context nor a `decoder`: observing its attention
    kernels on CUDA raised AttributeError before the first step (found by mypy --strict)."""
    from probe.runner import HFSession, TorchtuneSession, _observes_kernels, _Session

    torchtune = object.__new__(TorchtuneSession)
    assert not hasattr(torchtune, "_autocast")
    assert not _observes_kernels(torchtune, "cuda", "sdpa")
    for session_type in (_Session, HFSession):
        session = object.__new__(session_type)
        assert _observes_kernels(session, "cuda", "sdpa")
        assert not _observes_kernels(session, "cuda", "eager")
        assert not _observes_kernels(session, "cpu", "sdpa")
