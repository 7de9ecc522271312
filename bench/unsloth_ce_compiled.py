"""The buffers of one chunk of Unsloth's fused cross-entropy when torch.compile builds it (the
source of the `unsloth` loss in estimator/memory/logits.py).

unsloth_zoo (main ce232d6c, 2026-08-20) fused_losses/cross_entropy_loss.py splits the hidden
states into chunks and, for each, runs `accumulate_chunk`: `torch.func.grad_and_value` of
`compute_fused_ce_loss` (lm_head matmul, `.float()`, `F.cross_entropy(reduction="sum")`, divided
by the item count), then writes the chunk's hidden-state gradient into `grad_inputs`
(:260-345). `accumulate_chunk` is `torch.compile(dynamic=True, fullgraph=True)`-ed (:350-356)
whenever the caller asks for it, and unsloth's causal-LM forward does (unsloth main 015bdef0d9
models/llama.py:1497-1508 `torch_compile = True`); it runs eager only if that compile raises
(:362-392) or UNSLOTH_FUSED_CE_COMPILE_DISABLE=1 (:50-51).

This script builds the same computation (its own code, the same ops: linear, upcast,
cross-entropy sum, divide, grad_and_value, a slice write) with a frozen head, compiles it with
inductor on the CPU (needs a C++ compiler) and walks the generated `call()`: each buffer it
allocates, the ones it reuses in place, and the peak of the buffers alive at once. Buffer reuse
is decided by inductor's scheduler, not by the CPU backend (torch/_inductor/scheduler.py
`decide_inplace_update`; config `inplace_buffers`), so the plan carries over to CUDA; reductions
over a 10^5-wide vocabulary are not persistent there either (they stay separate kernels reading
the logits).

    PYTHONPATH=. .venv/bin/python bench/unsloth_ce_compiled.py [--tokens 2048] [--vocab 32768]

Prints, asserts nothing. What it showed (torch 2.13.0, CPU): the logits' bf16 buffer is
overwritten by their gradient (`buf5 = buf0; del buf0  # reuse`), three fp32 values per row
(max, log-sum-exp, the target's logit) and the chunk's bf16 hidden-state gradient: 2.0 bytes
per logit, not the eager chain's bf16 logits + fp32 upcast + fp32 log-softmax + fp32 gradient.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

BYTES = {"torch.bfloat16": 2, "torch.float16": 2, "torch.float32": 4, "torch.int64": 8}
ALLOC = re.compile(r"(buf\d+) = empty_strided_cpu\(\(([^)]*)\),.*?(torch\.\w+)\)")
REUSE = re.compile(r"(buf\d+) = (buf\d+); del (buf\d+)\s+# reuse")


def _chunk_step() -> Any:
    import torch
    import torch.nn.functional as F

    def loss(hidden: Any, head: Any, labels: Any, divisor: Any) -> Any:
        logits = F.linear(hidden.to(head.dtype), head)
        total = F.cross_entropy(
            logits.view(-1, head.shape[0]).float(), labels.view(-1), reduction="sum"
        )
        return total / divisor, total.detach()

    def step(grad_chunk: Any, hidden: Any, head: Any, labels: Any, divisor: Any, acc: Any) -> None:
        grad, (_, value) = torch.func.grad_and_value(loss, argnums=0, has_aux=True)(
            hidden, head, labels, divisor
        )
        acc.add_(value)
        grad_chunk[:] = grad

    return step


def buffer_plan(source: str) -> tuple[list[str], int]:
    """Lines describing the allocations of inductor's generated `call()` and the peak bytes of
    the buffers it allocates (inputs and outputs it writes in place are not counted)."""
    body = source[source.index("def call(") :]
    live: dict[str, int] = {}
    lines: list[str] = []
    current = peak = 0
    for raw in body.splitlines():
        line = raw.strip()
        alloc = ALLOC.match(line)
        if alloc:
            dims = [int(d) for d in alloc.group(2).split(",") if d.strip()]
            live[alloc.group(1)] = math.prod(dims) * BYTES[alloc.group(3)]
            current += live[alloc.group(1)]
            peak = max(peak, current)
            lines.append(f"alloc {alloc.group(1)} {tuple(dims)} {alloc.group(3)}")
            continue
        reuse = REUSE.match(line)
        if reuse:
            live[reuse.group(1)] = live.pop(reuse.group(2))
            lines.append(f"reuse {reuse.group(1)} <- {reuse.group(2)} (written in place)")
            continue
        for name in re.findall(r"del (buf\d+)", line):
            if name in live:
                current -= live.pop(name)
    return lines, peak


def main(argv: list[str] | None = None) -> int:
    import torch
    from torch._inductor.utils import run_and_get_code

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args(argv)
    tokens, vocab, hidden = args.tokens, args.vocab, args.hidden

    head = torch.randn(vocab, hidden, dtype=torch.bfloat16)  # frozen (LoRA)
    states = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,))
    grad_chunk = torch.empty_like(states)
    acc, divisor = torch.zeros(()), torch.tensor(float(tokens))
    # unsloth_zoo temporary_patches/common.py get_torch_compile_options: epilogue fusion, shape
    # padding, dce; its memory_planning pools the same buffers (off here, to read them one by one)
    options = {"epilogue_fusion": True, "shape_padding": True, "dce": True}
    compiled = torch.compile(_chunk_step(), dynamic=False, fullgraph=True, options=options)
    _, sources = run_and_get_code(compiled, grad_chunk, states, head, labels, divisor, acc)
    lines, peak = buffer_plan(sources[-1])
    for line in lines:
        print(line)
    logits = tokens * vocab
    print(
        f"tokens={tokens} vocab={vocab} hidden={hidden}: peak of the step's own buffers "
        f"{peak:,} B = {peak / logits:.3f} B per logit "
        f"(bf16 logits alone: 2; the chunk's hidden-state gradient {tokens * hidden * 2:,} B, "
        f"3 fp32 per row {tokens * 12:,} B)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
