"""Linear attention (Gated DeltaNet, qwen3_5 / qwen3_next): which kernel runs, and its fake model.

On a GPU with `flash-linear-attention` (fla) installed transformers calls fla's Triton kernel
`chunk_gated_delta_rule`; without it, a reference torch implementation whose memory is not the
kernel's (it materialises per-chunk matrices; 4 layers at 48k reach 277 GiB) and which takes
about 11 s per layer to trace at 48k tokens. So:

- `cuda`, `cpu`: whatever transformers picks runs, and the memtest says which;
- `fake`: transformers' `torch_chunk_gated_delta_rule` is replaced by the custom op
  `trainfit::gated_delta_fwd` (+ `trainfit::gated_delta_bwd`), whose fake functions allocate what
  fla's `ChunkGatedDeltaRuleFunction` (fla 0.3/0.4, `fla/ops/gated_delta_rule/chunk.py`) returns,
  saves and uses as scratch. The assumption, per layer, with B batch, T tokens, H key heads,
  HV value heads (HV >= H, grouped values handled inside the kernel), K/V head dims, BT = 64 the
  chunk, NT = ceil(T / BT), x the input dtype (bf16):

  returned  o (B,T,HV,V) x; final state (B,HV,K,V) fp32 only when asked for (not in training)
  saved     l2-normalised q, k (B,T,H,K) x and their rstd (B,T,H) fp32; g's chunk-local cumsum
            (B,T,HV) fp32; A = (I + tril(beta k k^T))^-1 per chunk (B,T,HV,BT) x; plus the inputs
            v, beta (kept by reference)
  forward scratch   A before the solve (B,T,HV,BT) fp32, w (B,T,HV,K) x, u and v_new
            (B,T,HV,V) x, chunk states h (B,NT,HV,K,V) x
  backward  returns dq, dk (like q, k), dv (like v), dg (like g), dbeta (like beta);
            scratch: h and dh (B,NT,HV,K,V) x, w, u, v_new, dv2 as above, dA (B,T,HV,BT) fp32

  The real implementation behind the op (used on the CPU only by the tests) is transformers'
  torch fallback: forward under no_grad, backward by recomputing through it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from probe.config import text_config

__all__ = ["install_linear_attention", "gated_delta_rule", "FAKE_KERNEL_NAME"]

CHUNK = 64
FAKE_KERNEL_NAME = (
    "trainfit::gated_delta_fwd/bwd fake op modelling fla chunk_gated_delta_rule "
    "(saves l2-normed q,k + rstd, g cumsum, A; scratch h (B,NT,HV,K,V))"
)
FALLBACK_NAME = "transformers torch_chunk_gated_delta_rule (torch fallback, not the GPU kernel)"
FLA_NAME = "fla chunk_gated_delta_rule (flash-linear-attention)"

_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
)

_fallback: Callable[..., Any] | None = None  # transformers' reference implementation


def _has_linear_attention(config: dict[str, Any]) -> bool:
    layer_types = text_config(config).get("layer_types") or []
    return "linear_attention" in layer_types


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * (torch.finfo(dtype).bits // 8)


def _fwd_scratch_bytes(q: torch.Tensor, v: torch.Tensor) -> int:
    b, t, h, k = q.shape
    hv, dv = v.shape[-2:]
    nt = -(-t // CHUNK)
    x = v.dtype
    return (
        _nbytes((b, t, hv, CHUNK), torch.float32)  # A before solve_tril
        + _nbytes((b, t, hv, k), x)  # w
        + 2 * _nbytes((b, t, hv, dv), x)  # u, v_new
        + _nbytes((b, nt, hv, k, dv), x)  # h
    )


def _bwd_scratch_bytes(q: torch.Tensor, v: torch.Tensor) -> int:
    b, t, h, k = q.shape
    hv, dv = v.shape[-2:]
    nt = -(-t // CHUNK)
    x = v.dtype
    return (
        2 * _nbytes((b, nt, hv, k, dv), x)  # h, dh
        + _nbytes((b, t, hv, k), x)  # w
        + 3 * _nbytes((b, t, hv, dv), x)  # u, v_new, dv2
        + _nbytes((b, t, hv, CHUNK), torch.float32)  # dA
    )


# -- the ops -------------------------------------------------------------------------------


@torch.library.custom_op("trainfit::gated_delta_fwd", mutates_args=())
def gated_delta_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm: bool,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """Returns (o, final_state, q_saved, q_rstd, k_saved, k_rstd, g_saved, A, fwd_scratch)."""
    if _fallback is None:
        raise RuntimeError("trainfit::gated_delta_fwd needs transformers' torch fallback")
    with torch.no_grad():
        o, state = _fallback(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm,
        )
    fake_out = _fake_fwd(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm)
    # the real path keeps the *original* q, k, g in the saved slots (the backward recomputes)
    final = state.float() if output_final_state else fake_out[1].zero_()
    return (
        o.contiguous(),
        final,
        q.clone(),
        *fake_out[3:4],
        k.clone(),
        fake_out[5],
        g.clone(),
        *fake_out[7:],
    )


@gated_delta_fwd.register_fake
def _fake_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, ...]:
    b, t, h, kd = q.shape
    hv, vd = v.shape[-2:]
    o = v.new_empty((b, t, hv, vd))
    final = (
        q.new_empty((b, hv, kd, vd), dtype=torch.float32)
        if output_final_state
        else q.new_empty((0,), dtype=torch.float32)
    )
    q_saved = torch.empty_like(q)
    k_saved = torch.empty_like(k)
    q_rstd = q.new_empty((b, t, h), dtype=torch.float32)
    k_rstd = k.new_empty((b, t, h), dtype=torch.float32)
    g_saved = g.new_empty((b, t, hv), dtype=torch.float32)
    a = v.new_empty((b, t, hv, CHUNK))
    scratch = q.new_empty((_fwd_scratch_bytes(q, v),), dtype=torch.uint8)
    return o, final, q_saved, q_rstd, k_saved, k_rstd, g_saved, a, scratch


@torch.library.custom_op("trainfit::gated_delta_bwd", mutates_args=())
def gated_delta_bwd(
    do: torch.Tensor,
    q_saved: torch.Tensor,
    k_saved: torch.Tensor,
    v: torch.Tensor,
    g_saved: torch.Tensor,
    beta: torch.Tensor,
    a: torch.Tensor,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dq, dk, dv, dg, dbeta, bwd_scratch). Fake only: real tensors take the Python path
    in `_GatedDeltaRule.backward` (autograd cannot run inside an op's kernel)."""
    raise NotImplementedError("trainfit::gated_delta_bwd has only a fake implementation")


@gated_delta_bwd.register_fake
def _fake_bwd(
    do: torch.Tensor,
    q_saved: torch.Tensor,
    k_saved: torch.Tensor,
    v: torch.Tensor,
    g_saved: torch.Tensor,
    beta: torch.Tensor,
    a: torch.Tensor,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, ...]:
    scratch = q_saved.new_empty((_bwd_scratch_bytes(q_saved, v),), dtype=torch.uint8)
    return (
        torch.empty_like(q_saved),
        torch.empty_like(k_saved),
        torch.empty_like(v),
        torch.empty_like(g_saved),
        torch.empty_like(beta),
        scratch,
    )


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class _GatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        initial_state: torch.Tensor | None,
        output_final_state: bool,
        use_qk_l2norm: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o, final, q_s, q_rstd, k_s, k_rstd, g_s, a, scratch = torch.ops.trainfit.gated_delta_fwd(
            q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm
        )
        del scratch  # forward scratch (h, w, u, v_new) is freed when the kernel returns
        ctx.save_for_backward(q_s, q_rstd, k_s, k_rstd, v, g_s, beta, a)
        ctx.use_qk_l2norm = use_qk_l2norm
        ctx.mark_non_differentiable(final)
        return o, final

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, _dfinal: torch.Tensor) -> tuple[Any, ...]:
        q_s, _q_rstd, k_s, _k_rstd, v, g_s, beta, a = ctx.saved_tensors
        if _is_fake(do):
            dq, dk, dv, dg, dbeta, scratch = torch.ops.trainfit.gated_delta_bwd(
                do, q_s, k_s, v, g_s, beta, a, ctx.use_qk_l2norm
            )
            del scratch
        else:
            assert _fallback is not None
            with torch.enable_grad():
                ins = [t.detach().requires_grad_(True) for t in (q_s, k_s, v, g_s, beta)]
                o, _ = _fallback(
                    *ins[:3], g=ins[3], beta=ins[4], use_qk_l2norm_in_kernel=ctx.use_qk_l2norm
                )
                dq, dk, dv, dg, dbeta = torch.autograd.grad(o, ins, do)
        return dq, dk, dv, dg, dbeta, None, None, None


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = CHUNK,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drop-in for transformers' `torch_chunk_gated_delta_rule` (same arguments and returns)."""
    o, final = _GatedDeltaRule.apply(  # type: ignore[no-untyped-call]
        query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel
    )
    return o, (final if output_final_state else None)


# -- installing ------------------------------------------------------------------------------


def _loaded_modules() -> list[Any]:
    import importlib

    mods = []
    for name in _MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            continue
    return mods


def _fla_available() -> bool:
    try:
        import fla  # noqa: F401
    except ImportError:
        return False
    return True


def _fla_name() -> str:
    """FLA_NAME with the installed release (the kernel's memory differs between releases)."""
    from probe.environment import package_version

    release = package_version("flash-linear-attention") or package_version("fla-core")
    return f"{FLA_NAME} {release}" if release else FLA_NAME


@contextlib.contextmanager
def install_linear_attention(config: dict[str, Any], device: str) -> Iterator[str | None]:
    """Yield the name of the linear-attention kernel used (None: the model has none).

    For `fake` the custom op replaces transformers' function while the context is active.
    """
    global _fallback
    if not _has_linear_attention(config):
        yield None
        return
    if device != "fake":
        yield _fla_name() if (device == "cuda" and _fla_available()) else FALLBACK_NAME
        return
    patched: list[tuple[Any, Any]] = []
    for mod in _loaded_modules():
        original = getattr(mod, "torch_chunk_gated_delta_rule", None)
        if original is None:
            continue
        if _fallback is None:
            _fallback = original
        patched.append((mod, original))
        mod.torch_chunk_gated_delta_rule = gated_delta_rule
    try:
        yield FAKE_KERNEL_NAME if patched else FALLBACK_NAME
    finally:
        for mod, original in patched:
            mod.torch_chunk_gated_delta_rule = original
