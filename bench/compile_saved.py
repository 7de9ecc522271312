"""What torch.compile keeps for the backward of one decoder layer (the source of
estimator/memory/activations_compiled.py).

Runs AOTAutograd with torch's own `min_cut_rematerialization_partition` and core decompositions
(what inductor uses for training; no code generation, so it runs on the CPU) on transformers'
`LlamaDecoderLayer` in bf16 with SDPA, and prints the forward graph's saved tensors next to
what the eager layer saves (saved-tensor hooks). Parameters are left out of both. On the CPU,
SDPA decomposes to its math form, whose (heads, s, s) probabilities show up as saved; on CUDA
the flash / efficient kernel is an opaque op that saves its output and a logsumexp instead, so
the (s, s) tensor is reported apart and not counted.

    PYTHONPATH=. .venv/bin/python bench/compile_saved.py          # weights trained
    PYTHONPATH=. .venv/bin/python bench/compile_saved.py --frozen # weights frozen (LoRA base)
"""

from __future__ import annotations

import argparse
from typing import Any


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frozen", action="store_true", help="layer weights frozen")
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args(argv)

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

    def compiler(gm: Any, example: Any) -> Any:
        def forward(graph: Any, _inputs: Any) -> Any:
            outputs = [n for n in graph.graph.nodes if n.op == "output"][0].args[0]
            for node in outputs[1:]:
                val = node.meta.get("val") if hasattr(node, "meta") else None
                if val is None or not hasattr(val, "shape") or tuple(val.shape) in param_shapes:
                    continue
                size = val.numel() * val.element_size()
                square = val.dim() == 4 and val.shape[-1] == val.shape[-2] == tokens
                compiled["square" if square else "bytes"] += size
                print(f"  saved {node.name:<14} {str(val.dtype):<15} {tuple(val.shape)}")
            return graph

        return aot_module_simplified(
            gm,
            example,
            fw_compiler=forward,
            bw_compiler=lambda graph, _inputs: graph,
            partition_fn=min_cut_rematerialization_partition,
            decompositions=core_aten_decompositions(),
        )

    torch.compile(layer, backend=compiler)(x, position_embeddings=(cos, sin), attention_mask=None)
    q, k = heads * h // heads, kv * h // heads
    print(f"h={h} q={q} kv={k} m={m} tokens={tokens} frozen={args.frozen}")
    print(f"eager saved    {eager[0] / tokens:9.0f} B/token (incl. cos/sin)")
    print(
        f"compiled saved {compiled['bytes'] / tokens:9.0f} B/token "
        f"(+ {compiled['square'] / tokens:.0f} B/token of CPU-math SDPA probabilities)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
