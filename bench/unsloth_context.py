"""Unsloth's published longest-context table against `max_seq` under `--stack unsloth`.

Unsloth's README (unslothai/unsloth@ce9e54755f README.md:395-415, December 2024) gives the
longest sequence Llama-3.1-8B (:397-407) and Llama-3.3-70B (:409-415, the architecture of the
`llama-3.1-70b` preset) train at per card size: 4-bit QLoRA on q, k, v, o, gate, up and down
at rank 32, batch 1, sequences padded to the length, Unsloth's offloaded checkpointing. The 8B
figures are exactly linear in the memory (18,876 tokens per 4 GB), so an extrapolation from a
few runs, and the README states neither whether "GB" is 10^9 bytes or
GiB nor the attention backend (flash-attn, xformers or SDPA: Unsloth takes the first one
installed; its Colab installs of the time brought xformers). That is why the table is shown
here and not among bench/published.py's targets. Each column is `max_seq` with the whole card
usable (`usable_fraction` 1.0), its error against the README in parentheses.

    PYTHONPATH=. .venv/bin/python bench/unsloth_context.py
"""

from __future__ import annotations

from estimator.model_source import resolve_model
from estimator.profile import load_profile
from estimator.request import ModelInput
from estimator.setup import TrainingSetup
from estimator.solvers import Budget, max_seq

SOURCE = "unslothai/unsloth@ce9e54755f README.md:395-415"
# (preset, card size in GB) -> Unsloth's longest context (tokens), QLoRA r32 all-linear
PUBLISHED = {
    ("llama-3.1-8b", 8): 2_972,
    ("llama-3.1-8b", 12): 21_848,
    ("llama-3.1-8b", 16): 40_724,
    ("llama-3.1-8b", 24): 78_475,
    ("llama-3.1-8b", 40): 153_977,
    ("llama-3.1-8b", 48): 191_728,
    ("llama-3.1-8b", 80): 342_733,
    ("llama-3.1-70b", 48): 12_106,  # Llama-3.3-70B: Llama-3.1-70B's architecture
    ("llama-3.1-70b", 80): 89_389,
}
NAMES = {"llama-3.1-8b": "Llama-3.1-8B", "llama-3.1-70b": "Llama-3.3-70B"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 2**30
COLUMNS = (("sdpa", GIB), ("xformers", GIB), ("xformers", 10**9))


def longest(attention: str, capacity_bytes: int, preset: str = "llama-3.1-8b") -> int | None:
    """`max_seq` of the README's setup on a card of `capacity_bytes`, all of it usable."""
    spec = resolve_model(ModelInput(preset=preset))
    setup = TrainingSetup(
        stack="unsloth",
        method="qlora",
        lora_rank=32,
        lora_targets=TARGETS,
        attention=attention,
    )
    answer = max_seq(spec, setup, Budget(capacity_bytes, 1.0), load_profile("default"))
    value = answer["seq_len"]
    return None if value is None else int(value)


def table() -> str:
    """The comparison as a markdown table."""
    head = ["model", "card", "Unsloth README"] + [
        f"{attention}, GB = {'GiB' if unit == GIB else '10^9 B'}" for attention, unit in COLUMNS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (preset, gb), published in PUBLISHED.items():
        cells = [NAMES[preset], f"{gb} GB", f"{published:,}"]
        for attention, unit in COLUMNS:
            ours = longest(attention, gb * unit, preset)
            cells.append(
                "none"
                if ours is None
                else f"{ours:,} ({(ours - published) / published * 100:+.1f} %)"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(f"QLoRA r32 all-linear, --stack unsloth, vs {SOURCE}\n")
    print(table())
