"""A small llama-like decoder in plain torch, and LoRA layers, for boxes without transformers/peft.

Shapes follow transformers' LlamaForCausalLM (same parameter names and counts for llama, mistral,
qwen2 and qwen3 configs without biases), so parameter counts and weight memory agree; the
activation memory is that of this code (SDPA attention, SwiGLU MLP), close to but not identical
to transformers'. Used only when transformers is not importable (or TRAINFIT_PROBE_BUILTIN=1).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["BuiltinCausalLM", "LoRALinear", "apply_builtin_lora"]


@dataclass
class _Out:
    last_hidden_state: torch.Tensor | None = None
    loss: torch.Tensor | None = None


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding on (b, heads, s, d)."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class _Layer(nn.Module):
    gradient_checkpointing = False

    def __init__(self, cfg: dict[str, Any], owner: BuiltinCausalLM) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv = cfg.get("num_key_value_heads") or self.heads
        self.hd = cfg.get("head_dim") or h // self.heads
        self.theta = float(cfg.get("rope_theta", 10000.0))
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        m = cfg["intermediate_size"]
        self.owner = [owner]  # not a submodule
        self.input_layernorm = _RMSNorm(h, eps)
        self.post_attention_layernorm = _RMSNorm(h, eps)
        self.q_proj = nn.Linear(h, self.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.heads * self.hd, h, bias=False)
        self.gate_proj = nn.Linear(h, m, bias=False)
        self.up_proj = nn.Linear(h, m, bias=False)
        self.down_proj = nn.Linear(m, h, bias=False)
        self._gradient_checkpointing_func = checkpoint

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = _rope(q, self.theta), _rope(k, self.theta)
        if self.kv != self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        if self.owner[0].eager_attention:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            attn = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        else:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        y = self.post_attention_layernorm(x)
        out: torch.Tensor = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            checkpointed: torch.Tensor = self._gradient_checkpointing_func(self._forward, x)
            return checkpointed
        return self._forward(x)


class _Decoder(nn.Module):
    def __init__(self, cfg: dict[str, Any], owner: BuiltinCausalLM) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(_Layer(cfg, owner) for _ in range(cfg["num_hidden_layers"]))
        self.norm = _RMSNorm(cfg["hidden_size"], float(cfg.get("rms_norm_eps", 1e-6)))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> _Out:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return _Out(last_hidden_state=self.norm(x))


class BuiltinCausalLM(nn.Module):
    """Llama-shaped causal LM: embed, N x (attention + SwiGLU MLP), norm, LM head."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.eager_attention = False
        self.model = _Decoder(cfg, self)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_word_embeddings"):
            self.lm_head.weight = self.model.embed_tokens.weight
        for p in self.parameters():
            if p.dim() == 2 and p.device.type != "meta":
                nn.init.normal_(p, std=float(cfg.get("initializer_range", 0.02)))

    def get_decoder(self) -> nn.Module:
        return self.model

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, use_cache: bool = False
    ) -> _Out:
        hidden = self.model(input_ids).last_hidden_state
        logits = self.lm_head(hidden).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1)
            )
        return _Out(loss=loss)


class LoRALinear(nn.Module):
    """y = base(x) + (x A^T B^T) * alpha / r, base frozen; A, B in fp32 or the base dtype."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, fp32: bool) -> None:
        super().__init__()
        self.base = base
        dtype = torch.float32 if fp32 else base.weight.dtype
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device, dtype=dtype)
        nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lora = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scale
        out: torch.Tensor = self.base(x) + lora.to(x.dtype)
        return out


def apply_builtin_lora(
    model: nn.Module, rank: int, alpha: float, targets: str | list[str], fp32: bool
) -> nn.Module:
    """Wrap the targeted nn.Linear layers (all but lm_head for 'all-linear') in LoRALinear;
    `targets` as peft's `target_modules`: 'all-linear', leaf names, or a regex over whole
    module names (probe.model.peft_target_modules)."""
    for path, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if not isinstance(child, nn.Linear) or name == "lm_head":
                continue
            full = f"{path}.{name}" if path else name
            if targets == "all-linear":
                hit = True
            elif isinstance(targets, str):
                hit = re.fullmatch(targets, full) is not None
            else:
                hit = name in targets
            if hit:
                setattr(module, name, LoRALinear(child, rank, alpha, fp32))
    return model
