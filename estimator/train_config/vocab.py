"""Translation tables shared by the training-config readers: optimizer names, attention
implementations, LoRA target spellings, model ids. trainfit's side uses the setup names of
issue 10 (`optimizer`, `optimizer_impl`, `paged`, `attention`, `lora_targets`, ...).

Sources (read, not copied):
- transformers 5.24.0 `training_args.py` `OptimizerNames` (lines 117-158) and `trainer_optimizer.py`
  lines 202-207 (`adamw_torch_fused` adds `fused=True`; `adamw_torch` is torch's default AdamW,
  foreach on CUDA tensors: torch 2.13 torch/optim/optimizer.py `_default_to_fused_or_foreach`,
  lines 161-186, fused only when asked), lines 806-811 (default `adamw_torch_fused` on
  torch >= 2.8).
- bitsandbytes optimizers named by HF/axolotl/torchtune: `adamw_bnb_8bit`/`adamw_8bit`,
  `paged_adamw_32bit`, `paged_adamw_8bit`, `bitsandbytes.optim.PagedAdamW[8bit]`; torchao's
  `AdamW8bit` (torchtune's tutorial, below) and `AdamW4bit` (`adamw_torch_4bit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.lora import REGEX
from estimator.train_config.result import TrainConfigMapping

# HF `optim` value -> trainfit optimizer fields. `optimizer_impl` only where the name fixes it.
HF_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw_torch": {"optimizer": "adamw", "optimizer_impl": "foreach"},
    "adamw_torch_fused": {"optimizer": "adamw", "optimizer_impl": "fused"},
    "adamw_hf": {"optimizer": "adamw", "optimizer_impl": "foreach"},
    "adamw_bnb_8bit": {"optimizer": "adamw-8bit", "paged": False},
    "adamw_8bit": {"optimizer": "adamw-8bit", "paged": False},  # alias of adamw_bnb_8bit
    "paged_adamw_8bit": {"optimizer": "adamw-8bit", "paged": True},
    # torchao's AdamW8bit, block_size 256 (transformers 5.25.0 training_args.py:125,
    # trainer_optimizer.py:459-476): the state bytes of bitsandbytes' blockwise states (see
    # COMPONENT_OPTIMIZERS); the Trainer's 32-bit embedding override is bitsandbytes' only, so
    # a full fine-tuning's embedding states are counted 32-bit here (an overestimate)
    "adamw_torch_8bit": {"optimizer": "adamw-8bit", "paged": False},
    # torchao's AdamW4bit (training_args.py:124, trainer_optimizer.py:459-465): trainfit's
    # adamw-4bit (estimator/memory/states.py ADAM4BIT_*)
    "adamw_torch_4bit": {"optimizer": "adamw-4bit", "paged": False},
    "paged_adamw_32bit": {"optimizer": "adamw", "paged": True},
    "adafactor": {"optimizer": "adafactor"},
    "sgd": {"optimizer": "sgd"},
    "lion_32bit": {"optimizer": "lion"},
    "paged_lion_32bit": {"optimizer": "lion", "paged": True},
}

# torchtune `optimizer._component_` -> trainfit optimizer fields (the `fused:` key adds the impl)
COMPONENT_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "torch.optim.AdamW": {"optimizer": "adamw"},
    "torch.optim.Adam": {"optimizer": "adamw"},
    "torch.optim.SGD": {"optimizer": "sgd"},
    "bitsandbytes.optim.PagedAdamW": {"optimizer": "adamw", "paged": True},
    "bitsandbytes.optim.PagedAdamW8bit": {"optimizer": "adamw-8bit", "paged": True},
    "bitsandbytes.optim.AdamW8bit": {"optimizer": "adamw-8bit", "paged": False},
    # torchao's 8-bit AdamW, the other one torchtune's tutorial names (pytorch/torchtune@1814feb17
    # docs/source/tutorials/memory_optimizations.rst:168-184): states in torch's allocator, a
    # uint8 code per value + one fp32 scale per block of 256 (torchao 0.7.0
    # prototype/low_bit_optim/subclass_8bit.py OptimState8bit.zeros; adam.py AdamW8bit
    # block_size=256), the bytes of bitsandbytes' blockwise states. Approximation: its step is
    # compiled per parameter (adam.py single_param_adam) and its fp32 temporaries are not
    # counted. Later torchao releases export the class as torchao.optim.AdamW8bit.
    "torchao.prototype.low_bit_optim.AdamW8bit": {"optimizer": "adamw-8bit", "paged": False},
    "torchao.optim.AdamW8bit": {"optimizer": "adamw-8bit", "paged": False},
    # its 4-bit AdamW (torchao 0.11.0 optim/adam.py:319 AdamW4bit), exported from both places
    "torchao.prototype.low_bit_optim.AdamW4bit": {"optimizer": "adamw-4bit", "paged": False},
    "torchao.optim.AdamW4bit": {"optimizer": "adamw-4bit", "paged": False},
}

# attention implementation names (transformers `attn_implementation`, LLaMA-Factory `flash_attn`)
ATTENTION: dict[str, str] = {
    "sdpa": "sdpa",
    "eager": "eager",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "fa2": "flash",
    "fa3": "flash",
    "disabled": "eager",  # LLaMA-Factory AttentionFunction.DISABLED -> "eager" (model_args.py)
}


# what a preference / RL trainer adds to an SFT step, said where one is estimated as SFT: TRL's
# DPOTrainer puts each row's chosen and rejected sequences in one batch (trl 1.16.0
# trainer/dpo_trainer.py:169) and runs a reference forward besides the policy's, both through
# the fused LM head the SFT estimate models (:1299, :1327-1338)
AS_SFT_UNDERESTIMATES = (
    "not modelled for this trainer: estimated as SFT of one sequence per row, an underestimate "
    "(a DPO step runs each row's chosen and rejected sequences together and a reference "
    "model's forward, trl 1.16.0 trainer/dpo_trainer.py:169, 1327-1338; TRL 1.16's own "
    "DPOTrainer is priced by setup.objective dpo)"
)


def set_trainer_loss(m: TrainConfigMapping, trainer: str) -> None:
    """`loss: full` for a config run by transformers' Trainer (`trainer` names it or its
    subclass), unless a key of the config chose another loss (Liger, Cut Cross-Entropy,
    chunked). Not TRL's SFTTrainer, whose every loss type runs its fused LM head (the hf
    stack's chunked loss): the
    Trainer's compute_loss calls the model with the labels and takes its loss (transformers
    5.25.0 trainer.py:2209, 2242), the model's ForCausalLMLoss over every logit
    (loss/loss_utils.py:178)."""
    if "loss" not in m.setup:
        origin = f"({trainer}: the model's own loss, transformers 5.25.0 trainer.py:2209, 2242)"
        m.set("loss", "full", origin)


# Hub kernels named as `attn_implementation` (transformers 5.25.0
# integrations/hub_kernels.py:375-427 `load_and_register_attn_kernel`: `repo[@rev][:name]`, an
# optional `paged|` prefix): a kernel repo that exports `flash_attn_varlen_func` is registered
# through transformers' own `flash_attention_forward` with the flash_attention_2 mask
# (:406-410), i.e. runs as flash attention. These repos are builds of FlashAttention 2 / 3 (the
# vLLM fork of FA3 is the one transformers' gpt-oss docs name, as it takes the sinks); other
# kernel repos stay unmodelled.
FLASH_KERNEL_REPOS = frozenset(
    {
        "kernels-community/flash-attn",
        "kernels-community/flash-attn2",
        "kernels-community/flash-attn3",
        "kernels-community/vllm-flash-attn3",
    }
)


def _attention_kind(value: str) -> str | None:
    if value in ATTENTION:
        return ATTENTION[value]
    name = value.split("|", 1)[-1].split(":", 1)[0].partition("@")[0].strip()
    return "flash" if name.lower() in FLASH_KERNEL_REPOS else None


def map_attention(m: TrainConfigMapping, value: object, key: str) -> None:
    """An attention implementation name (None: unset) as trainfit's `attention`, or ignored."""
    if value is None:
        return
    kind = _attention_kind(str(value))
    if kind is not None:
        m.set("attention", kind, key)
    else:
        m.ignore(key, f"attention {value!r} is not modelled")


ALL_LINEAR = ["all-linear"]
EMBEDDING_MODULES = {"embed_tokens", "lm_head", "wte", "word_embeddings", "embed_out", "output"}


# what makes a string target a pattern rather than a comma-separated list of names
REGEX_CHARACTERS = frozenset("[](){}*+?|^$\\")


def lora_targets(value: object, string_is_regex: bool = False) -> list[str] | None:
    """A target list as written in a config (`q_proj,v_proj`, a list, `all`, `all-linear`).
    `string_is_regex`: the config hands a string to peft as it is (axolotl), which peft reads
    as a regular expression over whole module names (estimator.lora.REGEX); a string with a
    pattern's characters then becomes one `re:` target."""
    if value is None:
        return None
    if string_is_regex and isinstance(value, str) and REGEX_CHARACTERS & set(value):
        return [f"{REGEX}{value.strip()}"]
    items = [str(v).strip() for v in value] if isinstance(value, list) else None
    if items is None:
        items = [t.strip() for t in str(value).split(",")]
    items = [t for t in items if t]
    if not items:
        return None
    if len(items) == 1 and items[0].lower() in ("all", "all-linear", "all_linear"):
        return list(ALL_LINEAR)
    return items


def bank_targets(values: object) -> tuple[list[str], list[str]]:
    """peft's `target_parameters` (axolotl's `lora_target_parameters`) as trainfit's expert-bank
    targets (estimator.lora.BANK_TARGETS): (tokens, entries that name no expert bank)."""
    items = [str(v) for v in values] if isinstance(values, list) else []
    kinds, other = set(), []
    for item in items:
        if "experts" in item and item.endswith("gate_up_proj"):
            kinds.add("gate_up")
        elif "experts" in item and item.endswith("down_proj"):
            kinds.add("down")
        else:
            other.append(item)
    if kinds == {"gate_up", "down"}:
        return ["experts"], other
    return [f"experts.{kind}_proj" for kind in sorted(kinds)], other


def add_bank_targets(m: TrainConfigMapping, values: object, key: str) -> None:
    """peft's `target_parameters` naming fused expert banks (ParamWrapper, estimator.lora
    BANK_TARGETS) join the targets; another parameter is reported as not modelled."""
    tokens, other = bank_targets(values)
    if tokens:
        base = [t for t in m.setup.get("lora_targets") or [] if t]
        origin = m.origin.get("lora_targets")
        m.set("lora_targets", base + tokens, f"{origin} + {key}" if origin else key)
    if other:
        m.ignore(key, f"adapters on {', '.join(other[:3])}: only MoE expert banks are modelled")


def trains_embeddings(modules: object) -> bool | None:
    """peft `modules_to_save` (axolotl `lora_modules_to_save`, LLaMA-Factory `additional_target`):
    True when it names the input embedding or the output head."""
    names = lora_targets(modules)
    if names is None:
        return None
    return any(n.split(".")[-1] in EMBEDDING_MODULES for n in names)


def model_ref(text: str, base_dir: Path | None = None) -> dict[str, str]:
    """A base model as a config names it: a local directory or file (relative to the config's
    folder first), else `estimator.hub.model_source` (preset id wins, then a Hub id). Without
    `base_dir` (a config's text sent to the service) no local path is looked at."""
    from estimator.hub import model_source, preset_or_hub

    if base_dir is None:
        return preset_or_hub(text)
    candidates = [Path(text)]
    if base_dir is not None and not Path(text).is_absolute():
        candidates.insert(0, base_dir / text)
    for path in candidates:
        if path.is_dir() and (path / "config.json").is_file():
            return {"file": str(path / "config.json")}
        if path.is_file():
            return {"file": str(path)}
    return model_source(text)


def with_revision(name: str, revision: object, base_dir: Path | None) -> dict[str, str]:
    """`model_ref` of a model at a revision (`model_revision`, axolotl's `revision_of_model`):
    a Hub id at that revision, also for a repo a preset was taken from (a preset is that repo's
    main); `main`, no revision, or a local file: `model_ref` as it is."""
    from estimator.hub import looks_like_hub_id, preset_or_hub

    ref = model_ref(name, base_dir)
    if revision in (None, "", "main") or "file" in ref or not looks_like_hub_id(name):
        return ref
    return preset_or_hub(f"{name.strip().split('@')[0]}@{revision}")
