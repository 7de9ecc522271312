"""Compile and tune flash-linear-attention's Gated DeltaNet kernels once, before the sweeps.

On the H200 of 2026-12-04 a fresh machine spent more than a sweep's time limit in Triton's
compiles and autotuning before the 27B seed model's first 16,000-token length finished
(tests/data/memtests/README.md). fla's autotune keys hold the head counts and sizes but not the
sequence length (fla 0.4.2 `fla/ops/common/chunk_o.py`, `chunk_delta_h.py`, `wy_fast.py`:
key=['H', 'K', 'V', 'BT', ...]), and Triton caches compiled kernels on disk (and, with
TRITON_CACHE_AUTOTUNING=1, the chosen configs), so one short forward + backward at the model's
shapes here saves that time in every later process on the machine.

    python bench/fla_warmup.py tests/data/configs/qwen3.5-27b.json [--tokens 1024]

Prints the seconds of the first and the second call. Exit 2 without CUDA or fla, or when the
config has no linear-attention layers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _shapes(config: dict[str, Any]) -> tuple[int, int, int]:
    """(value heads, key head dim, value head dim): transformers repeats q and k to the value
    heads before it calls the kernel (modeling_qwen3_5.py, Qwen3_5GatedDeltaNet.forward)."""
    text = config.get("text_config") or config
    heads = text.get("linear_num_value_heads")
    k_dim, v_dim = text.get("linear_key_head_dim"), text.get("linear_value_head_dim")
    if not (heads and k_dim and v_dim):
        raise ValueError("the config has no linear-attention layers (linear_num_value_heads)")
    return int(heads), int(k_dim), int(v_dim)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a config.json with Gated DeltaNet layers")
    parser.add_argument("--tokens", type=int, default=1024, help="sequence length of the call")
    args = parser.parse_args(argv)
    try:
        heads, k_dim, v_dim = _shapes(json.loads(Path(args.config).read_text()))
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        print(f"fla_warmup: {exc}", file=sys.stderr)
        return 2
    for call in ("first", "second"):
        started = time.monotonic()
        shape = (1, args.tokens, heads)
        q = torch.randn(*shape, k_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(*shape, k_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(*shape, v_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(*shape, device="cuda", dtype=torch.float32).sigmoid().log()
        beta = torch.rand(*shape, device="cuda", dtype=torch.bfloat16)
        g.requires_grad_(True)
        beta.requires_grad_(True)
        out, _ = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        out.float().sum().backward()
        torch.cuda.synchronize()
        print(f"{call} call: {time.monotonic() - started:.1f} s (H={heads}, K={k_dim}, V={v_dim})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
