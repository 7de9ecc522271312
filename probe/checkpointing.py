"""Activation checkpointing per decoder layer, kept on the device (`gpu`) or offloaded.

`gpu`: transformers' non-reentrant checkpointing of each decoder layer (the same as
`gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})`): each
layer keeps only its input; the backward pass recomputes the layer.

`offload`: the same checkpointing, with the saved layer inputs moved off the device, as
Unsloth's offloaded checkpointing does. torch's non-reentrant checkpoint saves the layer inputs
through `save_for_backward`, so saved-tensor hooks around it see exactly those inputs (the
tensors saved inside the layer are caught by checkpoint's own inner hooks). On CUDA the copy goes
to pinned host memory; on the CPU and under fake tensors it is a copy that the storage tracker
moves to its host count, so the device figures exclude it and `components.host` reports it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from probe.tracker import current_tracker

__all__ = ["enable_checkpointing", "offloaded_checkpoint"]


def _pack(tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
    if tensor.device.type == "cuda":
        host = torch.empty(
            tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=True, device="cpu"
        )
        host.copy_(tensor, non_blocking=True)
        return tensor.device, host
    copy = tensor.detach().clone()
    tracker = current_tracker()
    if tracker is not None:
        tracker.mark_host(copy)
    return tensor.device, copy


def _unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
    device, host = packed
    if device.type == "cuda":
        return host.to(device, non_blocking=True)
    return host.clone()  # a new device tensor, counted by the tracker


def offloaded_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """`torch.utils.checkpoint.checkpoint` with the saved inputs kept on the host."""
    kwargs.setdefault("use_reentrant", False)
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
        return checkpoint(function, *args, **kwargs)


def _plain_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("use_reentrant", False)
    return checkpoint(function, *args, **kwargs)


def enable_checkpointing(causal_lm: nn.Module, *, offload: bool) -> None:
    """Checkpoint every decoder layer of a transformers or built-in causal LM."""
    enable = getattr(causal_lm, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(causal_lm, "gradient_checkpointing_enable"):
        cast(Any, causal_lm).gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    func = offloaded_checkpoint if offload else _plain_checkpoint
    found = False
    for module in causal_lm.modules():
        if hasattr(module, "gradient_checkpointing"):
            layer: Any = module  # a decoder layer with transformers' checkpointing attributes
            layer._gradient_checkpointing_func = func
            if enable is None and not hasattr(causal_lm, "gradient_checkpointing_enable"):
                layer.gradient_checkpointing = True
            found = True
    if not found:
        raise ValueError(f"{type(causal_lm).__name__} does not support activation checkpointing")
