"""What torch.compile keeps for the backward of torchtune 0.6.1's decoder layer (the source of
estimator/memory/activations_compiled.py `repeats_kv` for the torchtune stack).

Runs torchtune's own `TransformerSelfAttentionLayer`, `MultiHeadAttention`, `FeedForward`,
`RMSNorm` and `RotaryPositionalEmbeddings` from a v0.6.1 checkout (the modules are loaded file
by file under stub parent packages: torchtune/__init__.py needs torchao, which the layer does
not use) in the llama3 layout, bf16, on the CPU, through AOTAutograd with inductor's
`min_cut_rematerialization_partition` and decomposition table but no code generation (as
bench/compile_saved.py and bench/titan_sac_saved.py), and lists the forward graph's saved
tensors (parameters left out; the rope `cache` buffer is listed, it is no activation).

Result (torch 2.13 CPU, dim 512, 8 heads, 2 kv heads, ffn 1536, 256 tokens): SDPA's k and v are
saved at the 8 query heads (modules/attention.py:285-291 expands them before SDPA), trained
and frozen alike: bench/results/tune_compiled_saved_2026-12-04.txt.

    git -C /path/to/torchtune archive v0.6.1 torchtune | tar -x -C /tmp/tt061
    PYTHONPATH=. .venv/bin/python bench/tune_compiled_saved.py --torchtune /tmp/tt061
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from bench.partitioned import Outputs, min_cut_backend, print_saved

_MODULES = (
    "torchtune.utils._import_guard",
    "torchtune.utils._logging",
    "torchtune.modules.kv_cache",
    "torchtune.modules.attention_utils",
    "torchtune.modules.attention",
)


def _load(root: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, root / (name.replace(".", "/") + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_torchtune(root: Path) -> dict[str, Any]:
    """torchtune's layer modules from the checkout at `root` (the folder holding torchtune/)."""
    for name in ("torchtune", "torchtune.modules", "torchtune.utils"):
        package = types.ModuleType(name)
        package.__path__ = [str(root / name.replace(".", "/"))]
        sys.modules[name] = package
    for name in _MODULES:
        _load(root, name)
    attention = sys.modules["torchtune.modules.attention"]
    sys.modules["torchtune.modules"].MultiHeadAttention = attention.MultiHeadAttention  # type: ignore[attr-defined]
    return {
        "MultiHeadAttention": attention.MultiHeadAttention,
        "TransformerSelfAttentionLayer": _load(
            root, "torchtune.modules.transformer"
        ).TransformerSelfAttentionLayer,
        "FeedForward": _load(root, "torchtune.modules.feed_forward").FeedForward,
        "RMSNorm": _load(root, "torchtune.modules.rms_norm").RMSNorm,
        "RotaryPositionalEmbeddings": _load(
            root, "torchtune.modules.position_embeddings"
        ).RotaryPositionalEmbeddings,
    }


def _layer(tt: dict[str, Any], dim: int, heads: int, kv_heads: int, ffn: int, tokens: int) -> Any:
    """A llama3-layout layer as torchtune's llama3 component builders assemble it."""
    import torch
    from torch import nn

    hd = dim // heads
    rope = tt["RotaryPositionalEmbeddings"](dim=hd, max_seq_len=tokens)
    attn = tt["MultiHeadAttention"](
        embed_dim=dim,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hd,
        q_proj=nn.Linear(dim, heads * hd, bias=False),
        k_proj=nn.Linear(dim, kv_heads * hd, bias=False),
        v_proj=nn.Linear(dim, kv_heads * hd, bias=False),
        output_proj=nn.Linear(dim, dim, bias=False),
        pos_embeddings=rope,
        max_seq_len=tokens,
        is_causal=True,
        attn_dropout=0.0,
    )
    mlp = tt["FeedForward"](
        gate_proj=nn.Linear(dim, ffn, bias=False),
        down_proj=nn.Linear(ffn, dim, bias=False),
        up_proj=nn.Linear(dim, ffn, bias=False),
    )
    layer = tt["TransformerSelfAttentionLayer"](
        attn=attn, mlp=mlp, sa_norm=tt["RMSNorm"](dim), mlp_norm=tt["RMSNorm"](dim)
    ).to(torch.bfloat16)
    rope.rope_init()  # the fp32 buffers, as torchtune keeps them
    return layer


def compiled_saved(layer: Any, x: Any) -> list[tuple[str, Any]]:
    """The forward graph's saved tensors (fake values) of the compiled layer."""
    import torch

    shapes = {tuple(p.shape) for p in layer.parameters()}
    saved: list[tuple[str, Any]] = []

    def record(outputs: Outputs) -> None:
        for name, val in outputs:
            if val.numel() > 1 and tuple(val.shape) not in shapes:
                saved.append((name, val))

    torch._dynamo.reset()
    torch.compile(layer, backend=min_cut_backend(record), fullgraph=True)(x)
    return saved


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchtune", type=Path, required=True, help="v0.6.1 source folder")
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args(argv)
    dim, heads, kv_heads, ffn, tokens = 512, 8, 2, 1536, args.tokens
    tt = load_torchtune(args.torchtune)
    print(f"dim={dim} q={dim} kv={kv_heads * dim // heads} ffn={ffn} heads={heads} "
          f"tokens={tokens} (bf16)")  # fmt: skip
    for label, trained in (("trained", True), ("frozen", False)):
        layer = _layer(tt, dim, heads, kv_heads, ffn, tokens)
        layer.requires_grad_(trained)
        x = torch.randn(1, tokens, dim, dtype=torch.bfloat16, requires_grad=True)
        total = print_saved(f"{label} saved", compiled_saved(layer, x), 24)
        print(f"{label}: {total / tokens:.0f} B/token (the rope cache buffer among them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
