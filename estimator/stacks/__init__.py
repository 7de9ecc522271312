"""Training stacks: what a framework (HF Trainer/TRL + peft + bitsandbytes, Unsloth, torchtune,
torchtitan, DeepSpeed, or trainfit's own probe loop) does that changes memory.

A stack is a data file `estimator/stacks/<name>.json`: one entry per fact,
`{"value": ..., "source": "<file>:<line> of the library release it was read from"}`. Entries
named like a `TrainingSetup` field (`OVERRIDES`) are the defaults of that field under the stack;
the others (`FACTS`) are behaviour the user cannot switch from trainfit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

STACKS = (
    "hf",
    "unsloth",
    "torchtune",
    "torchtitan",
    "torchtitan-2024",
    "deepspeed",
    "probe",
)
DEFAULT_STACK = "hf"

# TrainingSetup fields a stack file gives defaults for (unset fields resolve from the stack).
OVERRIDES = (
    "autocast",
    "optimizer_impl",
    "paged",
    "lora_dropout",
    "lora_alpha",
    "grad_accum",
    "double_quant",
    "loss",
    "loss_chunk",
    "checkpointing",
    "train_embeddings",
    "base",
    "kbit_prepare",
    "compile",
    "liger_kernels",
    "quantize_experts",
)

# TrainingSetup fields a stack file may give a default for; without one the field's own default
# stands (`fsdp_wrap`: `layer`, the decoder layers as units, the rest in the root).
OPTIONAL_OVERRIDES = ("fsdp_wrap", "adapter_dtype")

# Behaviour of the stack that is not a setup option.
FACTS = (
    "embeddings_32bit_under_8bit_adam",
    "fused_kernels",
    "loss_chunk_scope",
    "loss_num_chunks",
    "loss_upcasts_head",
    "loss_target_bytes",
    "loss_compiled",
    "eager_models",
    "materialised_masks",
    "fsdp_gathers_storage_dtype",
    "selective_saves",
    "expandable_segments",
    "mixed_precision",
    "rope_cache_buffers",
    "rope_tables_per_forward",
    "pp_keeps_outputs",
    "pp_keeps_last_reduce_input",
)

# Behaviour only some stacks have: a file without the entry has none of it (`get_optional`).
OPTIONAL_FACTS = (
    "nf4_dequant",
    "torchtune_modules",
    "sdpa_repeats_kv",
    "offload_holds_output",
    "loss_target_free_fraction",
    "experts_dequant",
    "final_logit_softcap",
    "full_precision",
    "loss_vocab_tile",
    "quantized_adapter_dtype",
    "embedding_output_leaf",
)


@dataclass(frozen=True)
class Fact:
    value: Any
    source: str


@dataclass(frozen=True)
class Stack:
    name: str
    about: str
    entries: dict[str, Fact]

    def get(self, key: str) -> Any:
        return self.entries[key].value

    def get_optional(self, key: str, default: Any) -> Any:
        """An OPTIONAL_OVERRIDES or OPTIONAL_FACTS entry's value, or `default` when the file
        gives none."""
        fact = self.entries.get(key)
        return default if fact is None else fact.value

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {k: {"value": f.value, "source": f.source} for k, f in sorted(self.entries.items())}


@cache
def load_stack(name: str) -> Stack:
    """The stack's file; every key of OVERRIDES and FACTS must be present with a source."""
    if name not in STACKS:
        raise ValueError(f"unknown stack {name!r}; known: {', '.join(STACKS)}")
    raw = json.loads((Path(__file__).parent / f"{name}.json").read_text())  # the package data
    about = str(raw.pop("_about", ""))
    entries = {k: Fact(v["value"], str(v["source"])) for k, v in raw.items()}
    missing = [k for k in OVERRIDES + FACTS if k not in entries]
    if missing:
        raise ValueError(f"stack {name!r} lacks {', '.join(missing)}")
    return Stack(name, about, entries)
