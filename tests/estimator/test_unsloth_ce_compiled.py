"""The source of the `unsloth` loss's bytes (estimator/memory/logits.py unsloth_chunk_bytes):
inductor's plan of Unsloth's compiled chunk step overwrites the chunk's bf16 logits with their
gradient. Compiles on the CPU (needs a C++ compiler), so a torch upgrade that changes the plan
fails here rather than silently."""

from __future__ import annotations

import re
import shutil

import pytest

from bench.unsloth_ce_compiled import main


@pytest.mark.skipif(shutil.which("g++") is None, reason="inductor's CPU backend needs g++")
def test_compiled_chunk_step_writes_the_gradient_over_the_logits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tokens, vocab = 256, 4096
    assert main(["--tokens", str(tokens), "--vocab", str(vocab), "--hidden", "64"]) == 0
    out = capsys.readouterr().out
    logits = re.search(r"alloc (buf\d+) \((\d+), (\d+)\) torch\.bfloat16", out)
    assert logits and (int(logits.group(2)), int(logits.group(3))) == (tokens, vocab)
    assert re.search(rf"reuse buf\d+ <- {logits.group(1)} ", out)  # gradient in place
    per_logit = float(re.search(r"= ([\d.]+) B per logit", out).group(1))  # type: ignore[union-attr]
    assert 2.0 <= per_logit < 2.2  # bf16 logits + rows + the chunk's hidden gradient
