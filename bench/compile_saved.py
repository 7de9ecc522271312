"""What torch.compile keeps for the backward of one decoder layer (the source of
estimator/memory/activations_compiled.py).

Runs AOTAutograd with what inductor trains with — torch's own
`min_cut_rematerialization_partition` and inductor's decomposition table (`select_decomp_table`)
— but no code generation, so it runs on the CPU, on transformers' `LlamaDecoderLayer` in bf16
with SDPA (kept opaque: it saves its output and a logsumexp, as flash does on CUDA), and prints
the forward graph's saved tensors next to what the eager layer saves (saved-tensor hooks).
Parameters are left out of both. `--loss` does the same for `F.cross_entropy(logits.float())`
on bf16 logits (torchtune's compiled compute_cross_entropy).

    PYTHONPATH=. .venv/bin/python bench/compile_saved.py          # weights trained
    PYTHONPATH=. .venv/bin/python bench/compile_saved.py --frozen # weights frozen (LoRA base)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from bench.partitioned import Outputs, min_cut_backend


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frozen", action="store_true", help="layer weights frozen")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--loss", action="store_true", help="the compiled cross-entropy")
    args = parser.parse_args(argv)
    if args.loss:
        return _loss(args.tokens)

    h, m, heads, kv, tokens = 512, 1536, 8, 2, args.tokens
    cfg = LlamaConfig(
        hidden_size=h,
        intermediate_size=m,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=1,
        vocab_size=128,
    )
    cfg._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(cfg, 0).to(torch.bfloat16)
    if args.frozen:
        layer.requires_grad_(False)
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(tokens)[None])
    param_shapes = {tuple(p.shape) for p in layer.parameters()}
    param_ptrs = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    seen: set[int] = set()
    eager = [0]

    def pack(t: Any) -> Any:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and ptr not in param_ptrs and t.numel() > 1:
            seen.add(ptr)
            eager[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos, sin), attention_mask=None)

    compiled = {"bytes": 0, "square": 0}

    def record(saved: Outputs) -> None:
        for name, val in saved:
            if tuple(val.shape) in param_shapes:
                continue
            size = val.numel() * val.element_size()
            square = val.dim() == 4 and val.shape[-1] == val.shape[-2] == tokens
            compiled["square" if square else "bytes"] += size
            print(f"  saved {name:<14} {str(val.dtype):<15} {tuple(val.shape)}")

    backend = min_cut_backend(record)
    torch.compile(layer, backend=backend)(x, position_embeddings=(cos, sin), attention_mask=None)
    q, k = heads * h // heads, kv * h // heads
    print(f"h={h} q={q} kv={k} m={m} tokens={tokens} frozen={args.frozen}")
    print(f"eager saved    {eager[0] / tokens:9.0f} B/token (incl. cos/sin)")
    print(
        f"compiled saved {compiled['bytes'] / tokens:9.0f} B/token "
        f"(+ {compiled['square'] / tokens:.0f} B/token of CPU-math SDPA probabilities)"
    )
    return 0


def _loss(tokens: int, vocab: int = 4096) -> int:
    import torch
    import torch.nn.functional as F

    def cross_entropy(logits: Any, labels: Any) -> Any:
        return F.cross_entropy(logits.float(), labels, reduction="sum")

    def show(kind: str) -> Callable[[Outputs], None]:
        def print_outputs(outputs: Outputs) -> None:
            for name, val in outputs:
                print(f"  {kind} {name:<24} {str(val.dtype):<15} {tuple(val.shape)}")

        return print_outputs

    compiler = min_cut_backend(show("saved"), show("gradient"))
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))
    torch.compile(cross_entropy, backend=compiler)(logits, labels).backward()
    print(f"tokens={tokens} vocab={vocab}: bf16 logits in, no fp32 (tokens, vocab) saved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
