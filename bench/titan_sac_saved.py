"""What torchtitan's per-op selective activation checkpointing keeps per decoder layer, eager
and under torch.compile (the source of estimator/memory/activations.py `selective_saved`).

Runs torchtitan's own code from a checkout (default: the release of its December 2024 H100
benchmarks, 9dec370): `TransformerBlock` and its parts from torchtitan/models/llama/model.py,
`RMSNorm` from torchtitan/models/norms.py, and `_save_list` / `_apply_ac_to_transformer_block`
from torchtitan/parallelisms/parallelize_llama.py, each taken out of the file by name (the
files' other imports, triton and the trainer's config, are not needed), on a small bf16 block
on the CPU:

- eager: the block under torchtitan's SAC wrapper runs its forward; what stays alive for the
  backward is what the policy's caching mode stored (torch/utils/checkpoint.py
  `_CachingTorchDispatchMode`: the outputs of every MUST_SAVE op), counted by storage, plus the
  checkpoint's input (the layer input);
- compiled: torch.compile of the same wrapped block (torchtitan's `apply_compile` compiles each
  wrapped block), AOTAutograd with inductor's `min_cut_rematerialization_partition` and
  decomposition table but no code generation (as bench/compile_saved.py); the forward graph's
  saved tensors are listed (parameters and the freqs_cis buffer left out).

Result (torch 2.13 CPU, dim 512, 8 heads, 2 kv heads, ffn 1536, 256 tokens): eager keeps the
outputs of mm 1, 3, 5, 7 (wq, wv, w1, w2), SDPA's output and logsumexp, plus the layer input;
compiled saves the same less w2's output (no backward op reads it): eager - compiled = dim x 2
bytes per token. bench/results/titan_sac_saved_2026-12-03.txt.

Compiled without the wrapper (i10g; estimator/memory/activations_compiled.py `repeats_kv`): SDPA's
q, k and v inputs are saved at the 8 query heads (k and v after `repeat_kv`, model.py:201-202),
not at the 2 kv heads, with the tensors transformers' layer keeps (bench/compile_saved.py) and
the rotary table's conjugate (complex64, head_dim / 2 per token). bench/results/
titan_sac_saved_2026-12-04.txt.

CUDA's SDPA op (`_scaled_dot_product_flash_attention`) is in `_save_list`; the CPU's
(`_scaled_dot_product_flash_attention_for_cpu`) is not, so the CPU op is added to the list to
keep what CUDA keeps (both save their output and an fp32 logsumexp per head and row).

    git -C /path/to/torchtitan worktree add /tmp/tt9dec370 9dec370
    PYTHONPATH=. .venv/bin/python bench/titan_sac_saved.py --torchtitan /tmp/tt9dec370
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

from bench.partitioned import Outputs, min_cut_backend, print_saved

_MODEL_NAMES = (
    "ModelArgs",
    "precompute_freqs_cis",
    "reshape_for_broadcast",
    "apply_rotary_emb",
    "repeat_kv",
    "Attention",
    "FeedForward",
    "TransformerBlock",
)


def _definitions(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> None:
    """Execute the top-level definitions `names` of the file at `path` in `namespace`."""
    tree = ast.parse(path.read_text())
    picked = []
    for node in tree.body:
        targets: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            targets = [node.name]
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if any(t in names for t in targets):
            picked.append(node)
    missing = set(names) - {
        n
        for node in picked
        for n in (
            [node.name]
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
            else [t.id for t in node.targets if isinstance(t, ast.Name)]  # type: ignore[union-attr]
        )
    }
    if missing:
        raise SystemExit(f"{path}: no top-level {sorted(missing)}")
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec"), namespace)


def load_torchtitan(root: Path) -> dict[str, Any]:
    """torchtitan's block, norm and SAC wrapper, from the checkout at `root`."""
    import dataclasses
    import typing
    from collections import defaultdict

    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own alias
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper as ptd_checkpoint_wrapper,
    )

    ns: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "F": F,
        "dataclass": dataclasses.dataclass,
        "Optional": typing.Optional,
        "Tuple": typing.Tuple,  # noqa: UP006 - the file's own name
        "defaultdict": defaultdict,
        "ptd_checkpoint_wrapper": ptd_checkpoint_wrapper,
    }
    _definitions(root / "torchtitan/models/norms.py", ("RMSNorm",), ns)
    ns["build_norm"] = lambda norm_type, dim, eps=1e-6: ns["RMSNorm"](dim, eps=eps)
    _definitions(root / "torchtitan/models/llama/model.py", _MODEL_NAMES, ns)
    _definitions(
        root / "torchtitan/parallelisms/parallelize_llama.py",
        ("_save_list", "_apply_ac_to_transformer_block"),
        ns,
    )
    ns["_save_list"].add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    return ns


def _block(ns: dict[str, Any], dim: int, heads: int, kv_heads: int, tokens: int) -> Any:
    """(block, SAC-wrapped block, freqs_cis, caching modes): torchtitan's wrapper imports
    `create_selective_checkpoint_contexts` when it wraps, so the wrapping sees a recorder that
    keeps each caching mode it makes (one per checkpoint call)."""
    import torch
    import torch.utils.checkpoint as cp

    args = ns["ModelArgs"](
        dim=dim, n_layers=1, n_heads=heads, n_kv_heads=kv_heads, max_seq_len=tokens
    )
    block = ns["TransformerBlock"](0, args).to(torch.bfloat16)
    ac = argparse.Namespace(mode="selective", selective_ac_option="op")
    modes: list[Any] = []
    original = cp.create_selective_checkpoint_contexts

    def recorder(*a: Any, **k: Any) -> Any:
        pair = original(*a, **k)
        modes.append(pair[0])
        return pair

    cp.create_selective_checkpoint_contexts = recorder  # type: ignore[assignment]
    try:
        wrapped = ns["_apply_ac_to_transformer_block"](block, ac)
    finally:
        cp.create_selective_checkpoint_contexts = original  # type: ignore[assignment]
    freqs = ns["precompute_freqs_cis"](dim // heads, tokens)
    return block, wrapped, freqs, modes


def eager_kept(wrapped: Any, x: Any, freqs: Any, modes: list[Any]) -> list[tuple[str, Any]]:
    """(op, tensor) of each storage the SAC caching mode holds after the forward."""
    out = wrapped(x, freqs)
    kept: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for func, entries in modes[-1].storage.items():
        # a list of the MUST_SAVE outputs (torch 2.6), or index -> output or a recompute marker
        for entry in entries.values() if isinstance(entries, dict) else entries:
            for wrapper in entry if isinstance(entry, tuple | list) else (entry,):
                t = getattr(wrapper, "val", wrapper)
                if not hasattr(t, "untyped_storage") or t.numel() <= 1:
                    continue
                ptr = t.untyped_storage().data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    kept.append((str(func), t))
    del out
    return kept


def compiled_saved(wrapped: Any, x: Any, freqs: Any, param_shapes: set[Any]) -> list[Any]:
    """The forward graph's saved tensors (fake values) of the compiled wrapped block."""
    import torch

    saved: list[Any] = []

    def record(outputs: Outputs) -> None:
        for name, val in outputs:
            if val.numel() > 1 and tuple(val.shape) not in param_shapes:
                saved.append((name, val))

    torch._dynamo.reset()
    torch.compile(wrapped, backend=min_cut_backend(record), fullgraph=True)(x, freqs)
    return saved


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchtitan", type=Path, required=True, help="torchtitan checkout")
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args(argv)
    dim, heads, kv_heads, tokens = 512, 8, 2, args.tokens
    ns = load_torchtitan(args.torchtitan)
    block, wrapped, freqs, modes = _block(ns, dim, heads, kv_heads, tokens)
    m = block.feed_forward.w1.out_features
    q, kv = dim, kv_heads * dim // heads
    print(f"dim={dim} q={q} kv={kv} ffn={m} heads={heads} tokens={tokens} (bf16)")
    x = torch.randn(1, tokens, dim, dtype=torch.bfloat16, requires_grad=True)

    kept = eager_kept(wrapped, x, freqs, modes)
    total = 0
    for op, t in kept:
        size = t.untyped_storage().nbytes()
        total += size
        print(f"  eager kept   {op:<52} {str(t.dtype):<15} {tuple(t.shape)}")
    input_bytes = x.numel() * x.element_size()
    print(f"eager: SAC cache {total / tokens:.0f} B/token + layer input {input_bytes / tokens:.0f}")

    # parameters and the freqs_cis buffer (a slice of the model's buffer) are not activations
    param_shapes = {tuple(p.shape) for p in block.parameters()} | {tuple(freqs.shape)}
    saved = compiled_saved(wrapped, x, freqs, param_shapes)
    ctotal = print_saved("compiled saved", saved, 30)
    print(f"compiled: {ctotal / tokens:.0f} B/token (the layer input among them)")
    print(f"eager - compiled: {(total + input_bytes - ctotal) / tokens:.0f} B/token")

    # the same block compiled without the SAC wrapper: what a compiled layer keeps for its
    # backward (no checkpointing; full checkpointing's recompute holds the same set)
    plain = compiled_saved(block, x, freqs, param_shapes)
    ptotal = print_saved("compiled, no AC, saved", plain, 22)
    print(f"compiled, no AC: {ptotal / tokens:.0f} B/token (the layer input among them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
