"""Seed 000's LoRA case, shared by the tests that price or check it."""

# LoRA r16 targets of seed 000 (shared/seeds/000_*.txt: "q/k/v/o, gate/up/down, in_proj_qkv,
# in_proj_z, out_proj").
SEED_TARGETS = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "in_proj_qkv",
    "in_proj_z",
    "out_proj",
]
