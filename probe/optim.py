"""The optimizers the setup names, as torch (or bitsandbytes) provides them.

| setup          | implementation                                 | state per trainable parameter |
|----------------|------------------------------------------------|-------------------------------|
| adamw          | `torch.optim.AdamW`                            | exp_avg + exp_avg_sq          |
| adamw-8bit     | `bitsandbytes.optim.AdamW8bit` (CUDA only)     | two 8-bit states + scales     |
| adamw-4bit     | `torchao.optim.AdamW4bit` (torchao installed)  | two 4-bit states + scales     |
| sgd            | `torch.optim.SGD`                              | none                          |
| sgd-momentum   | `torch.optim.SGD(momentum=0.9)`                | momentum buffer               |
| adafactor      | `torch.optim.Adafactor` (torch >= 2.5)         | factored row + column moments |
| lion           | `Lion` below (Chen et al. 2023, Algorithm 2)   | exp_avg                       |

torch keeps optimizer states in the parameter's dtype (bf16 parameters -> bf16 states).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer

from probe.model import UnsupportedSetup

__all__ = ["Lion", "MasterWeights", "make_optimizer", "optimizer_state_tensors"]

LR = 1e-5


class Lion(Optimizer):
    """Lion: update = sign(b1*m + (1-b1)*g); p -= lr*(update + wd*p); m = b2*m + (1-b2)*g."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


def make_optimizer(
    name: str, params: list[torch.Tensor], device: str, impl: str = "foreach"
) -> Optimizer:
    """The optimizer for `setup.optimizer`; `UnsupportedSetup` where it cannot run here.

    AdamW and SGD run the implementation `impl` (`setup.optimizer_impl`) names, on every device:
    `foreach` (the multi-tensor path, torch's default on CUDA) or `fused` (`torch._fused_adamw_`
    / `_fused_sgd_`, CPU kernels too). Left to its default, torch picks foreach only when every
    parameter is on a device with foreach kernels (torch 2.13 optim/optimizer.py:178-185,
    `_default_to_fused_or_foreach`; utils/_foreach_utils.py:8-10: cuda, xpu, mtia), so CPU
    tensors would take the per-tensor loop (`_single_tensor_adam`), whose step holds one
    tensor's `exp_avg_sq.sqrt()` at a time instead of the whole group's (`_multi_tensor_adam`,
    optim/adam.py `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`): the CPU step
    would not have the CUDA step's temporaries.
    """
    if impl not in ("foreach", "fused"):
        raise UnsupportedSetup(f"optimizer_impl={impl!r}: the probe loop runs foreach or fused")
    kind: dict[str, Any] = {"fused": True} if impl == "fused" else {"foreach": True}
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR, **kind)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, **kind)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, **kind)
    if name == "adafactor":
        adafactor = getattr(torch.optim, "Adafactor", None)
        if adafactor is None:
            raise UnsupportedSetup(
                f"optimizer=adafactor needs torch >= 2.5 (torch.optim.Adafactor); "
                f"this is torch {torch.__version__}"
            )
        optimizer: torch.optim.Optimizer = adafactor(params, lr=LR)
        return optimizer
    if name == "lion":
        return Lion(params, lr=LR)
    if name == "adamw-8bit":
        if device != "cuda":
            raise UnsupportedSetup(
                f"optimizer=adamw-8bit is not supported here: bitsandbytes' 8-bit AdamW runs on "
                f"CUDA only (device is {device})"
            )
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise UnsupportedSetup(
                "optimizer=adamw-8bit is not supported here: bitsandbytes is not installed"
            ) from None
        return bnb.optim.AdamW8bit(params, lr=LR)  # type: ignore[attr-defined,no-untyped-call]
    if name == "adamw-4bit":
        try:
            from torchao.optim import AdamW4bit
        except ImportError:
            raise UnsupportedSetup(
                "optimizer=adamw-4bit is not supported here: torchao is not installed"
            ) from None
        return AdamW4bit(params, lr=LR)  # type: ignore[no-any-return]
    raise UnsupportedSetup(f"unknown optimizer {name!r}")


class MasterWeights:
    """Mixed precision as the ZeRO paper counts it (Rajbhandari et al. 2020, section 3.1):
    bf16 weights and gradients in the model, an fp32 master copy of each trainable tensor and
    fp32 optimizer states here (2 + 2 + 4 + 8 = 16 bytes per parameter with Adam).

    The step runs one tensor at a time (one inner optimizer per tensor): the bf16 gradient is
    upcast into the master's `.grad`, the inner optimizer updates the master, the master is
    copied back into the bf16 weight; so the step's temporaries are those of one tensor."""

    def __init__(
        self, name: str, params: list[torch.Tensor], device: str, impl: str = "foreach"
    ) -> None:
        self.params = params
        self.masters = [p.detach().float() for p in params]
        for m in self.masters:
            m.requires_grad_(True)
        self.inner = [make_optimizer(name, [m], device, impl) for m in self.masters]

    @property
    def state(self) -> dict[Any, dict[str, Any]]:
        merged: dict[Any, dict[str, Any]] = {}
        for m, opt in zip(self.masters, self.inner, strict=True):
            merged[m] = {"master": m, **opt.state.get(m, {})}
        return merged

    @torch.no_grad()
    def step(self) -> None:
        for p, m, opt in zip(self.params, self.masters, self.inner, strict=True):
            if p.grad is None:
                continue
            m.grad = p.grad.float()
            p.grad = None
            opt.step()
            m.grad = None
            p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def make_training_optimizer(setup: dict[str, Any], params: list[torch.Tensor], device: str) -> Any:
    """`precision: mixed` with full fine-tuning keeps fp32 masters (MasterWeights); every
    other setup steps the parameters in their own dtype. AdamW and SGD run the setup's
    `optimizer_impl` (foreach, the probe stack's default, or fused) on every device."""
    impl = setup.get("optimizer_impl") or "foreach"
    if setup.get("precision") == "mixed" and setup.get("method") == "full":
        return MasterWeights(setup["optimizer"], params, device, impl)
    return make_optimizer(setup["optimizer"], params, device, impl)


def optimizer_state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Every tensor held in the optimizer's state (for the components at the peak)."""
    out: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                out.append(value)
            elif hasattr(value, "__dict__"):  # bitsandbytes keeps some states in objects
                out.extend(v for v in vars(value).values() if isinstance(v, torch.Tensor))
    return out
