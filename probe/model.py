"""Building the model to be measured from a config.json, with random weights.

transformers (when installed) builds the causal LM from the config: for multimodal configs such
as `qwen3_5` (a `text_config` next to a `vision_config`) only the text decoder with its LM head is
built, which is what a text-only fine-tune trains. Without transformers a small built-in llama-like
decoder (`probe.builtin`) is used. LoRA comes from peft (or the built-in adapter without peft).

Placement:
- `fake`: built on the meta device, LoRA applied and checkpointing enabled on meta, then
  materialised with `to_empty(device="cpu")` by the caller inside `FakeTensorMode` (peft cannot
  wrap a model built under fake mode; see probe-notes).
- `cpu` / `cuda`: built directly under `torch.device(device)` in the target dtype, so transformers
  initialises real random weights there (no fp32 host copy of the whole model).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from probe.checkpointing import enable_checkpointing
from probe.config import BUILTIN_MODEL_TYPES, text_config
from probe.options import ProbeInputError

__all__ = ["BuiltModel", "UnsupportedSetup", "build_model", "base_dtype", "count_params"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class UnsupportedSetup(RuntimeError):
    """The requested setup cannot run here (e.g. QLoRA without bitsandbytes on CUDA)."""


@dataclass
class BuiltModel:
    """The model to train and the parts the chunked loss needs."""

    model: nn.Module  # what is called for the full loss (peft wrapper or causal LM)
    decoder: nn.Module  # returns hidden states (last_hidden_state)
    lm_head: nn.Module
    params_total: int
    params_trainable: int
    library: str  # "transformers" or "builtin"
    notes: list[str] = field(default_factory=list)


def base_dtype(setup: dict[str, Any]) -> torch.dtype:
    """dtype of the (frozen or trained) base weights.

    fp32: everything fp32. Otherwise the model's weights are bf16; `mixed` full fine-tuning
    adds fp32 masters in the optimizer (probe.optim.MasterWeights), not autocast.
    """
    if setup["precision"] == "fp32":
        return torch.float32
    return torch.bfloat16


def count_params(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) unique parameter elements; tied weights counted once."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        n = p.numel()
        if hasattr(p, "quant_state") and getattr(p, "dtype", None) == torch.uint8:
            n *= 2  # bitsandbytes packs two 4-bit values per byte
        total += n
        if p.requires_grad:
            trainable += n
    return total, trainable


def _attn_implementation(setup: dict[str, Any], device: str, notes: list[str]) -> str:
    wanted = setup["attention"]
    if wanted == "eager":
        return "eager"
    if wanted == "flash":
        if device == "cuda":
            try:
                import flash_attn  # noqa: F401
            except ImportError:
                notes.append(
                    "attention=flash: flash_attn is not installed; ran SDPA, whose CUDA backend "
                    "is FlashAttention-2 where the shapes allow"
                )
                return "sdpa"
            return "flash_attention_2"
        notes.append("attention=flash: not available on the CPU; traced SDPA's flash kernel")
    return "sdpa"


def default_attention(text_config: Any, wanted: str, notes: list[str]) -> str:
    """`wanted` ("sdpa", "eager", ...) for the model class of `text_config`, or "eager" where
    the class has no SDPA path: transformers' default for such a model (modeling_utils.py
    `_check_and_adjust_attn_implementation` picks sdpa only where `_supports_sdpa`; Gemma 2
    sets it False for its softcapping, models/gemma2/modeling_gemma2.py:353), so the user's
    Trainer runs eager there, as the estimator's stack files say (`eager_models`)."""
    if wanted != "sdpa":
        return wanted
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(text_config)]
    except KeyError:
        return wanted
    if getattr(cls, "_supports_sdpa", True):
        return wanted
    notes.append(
        f"attention: {cls.__name__} has no SDPA path (_supports_sdpa False); ran eager, "
        "transformers' default for it"
    )
    return "eager"


@contextlib.contextmanager
def _build_device(device: str) -> Iterator[None]:
    target = torch.device("meta") if device == "fake" else torch.device(device)
    with target:
        yield


def _hf_model(config: dict[str, Any], setup: dict[str, Any], device: str, notes: list[str]) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    text = cfg.get_text_config() if "text_config" in config else cfg
    if text is not cfg:
        notes.append(f"built the text decoder ({type(text).__name__}) of a multimodal config")
    text.use_cache = False
    dtype = base_dtype(setup)
    attn = default_attention(text, _attn_implementation(setup, device, notes), notes)
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn}
    if setup["method"] == "qlora":
        kwargs.pop("dtype")
        kwargs.update(_qlora_kwargs(device))
        kwargs["dtype"] = torch.bfloat16
    with _build_device(device):
        model = AutoModelForCausalLM.from_config(text, **kwargs)  # type: ignore[no-untyped-call]
    return model


def _qlora_kwargs(device: str) -> dict[str, Any]:
    if device != "cuda":
        raise UnsupportedSetup(
            "method=qlora is not supported here: it needs bitsandbytes on a CUDA device "
            f"(device is {device})"
        )
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise UnsupportedSetup(
            "method=qlora is not supported here: bitsandbytes is not installed"
        ) from None
    raise UnsupportedSetup(
        "method=qlora is not supported by the probe yet: transformers quantises only while "
        f"loading a checkpoint, and the probe builds from a config ({BitsAndBytesConfig.__name__} "
        "on random weights needs a quantise-after-build step)"
    )


def peft_target_modules(targets: list[str]) -> str | list[str] | None:
    """trainfit's targets as peft's `target_modules`: `all-linear`; None for `peft-default`
    (peft picks the model type's); a list of names; or, with any `re:` target
    (estimator.lora.REGEX), one regex over whole module names, the names as peft matches them
    (the name or a dotted suffix: tuners_utils.check_target_module_exists)."""
    if targets == ["peft-default"]:
        return None
    if targets == ["all-linear"]:
        return "all-linear"
    if not any(t.startswith("re:") for t in targets):
        return list(targets)
    parts = [t[3:] if t.startswith("re:") else rf"(?:.*\.)?{re.escape(t)}" for t in targets]
    return parts[0] if len(parts) == 1 else "|".join(f"(?:{p})" for p in parts)


def _apply_lora(model: nn.Module, setup: dict[str, Any], notes: list[str]) -> nn.Module:
    targets = setup["lora_targets"]
    target = peft_target_modules(targets)
    alpha = setup["lora_alpha"] if setup["lora_alpha"] is not None else float(setup["lora_rank"])
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        from probe.builtin import apply_builtin_lora

        notes.append("peft is not installed: used the probe's built-in LoRA layers")
        if target is None:
            raise UnsupportedSetup("lora_targets peft-default: peft picks them; absent") from None
        return apply_builtin_lora(
            model, setup["lora_rank"], alpha, target, setup["adapter_dtype"] == "fp32"
        )
    # peft annotates lora_alpha as int; it is a float scale (alpha / r) and takes one
    lcfg = LoraConfig(
        r=setup["lora_rank"],
        lora_alpha=alpha,  # type: ignore[arg-type]
        target_modules=target,
        lora_dropout=0.0,
    )
    try:
        return get_peft_model(model, lcfg, autocast_adapter_dtype=setup["adapter_dtype"] == "fp32")
    except ValueError as exc:
        raise UnsupportedSetup(f"lora_targets {targets}: {exc}") from None


def build_model(
    config: dict[str, Any], setup: dict[str, Any], device: str, *, prefer_builtin: bool = False
) -> BuiltModel:
    """Build the model (on meta for `fake`), apply LoRA and checkpointing as `setup` says."""
    notes: list[str] = []
    library = "builtin"
    prefer_builtin = prefer_builtin or os.environ.get("TRAINFIT_PROBE_BUILTIN") == "1"
    if not prefer_builtin:
        try:
            import transformers  # noqa: F401

            library = "transformers"
        except ImportError:
            library = "builtin"
    if library == "transformers":
        causal_lm = _hf_model(config, setup, device, notes)
    else:
        from probe.builtin import BuiltinCausalLM

        if config["model_type"] not in BUILTIN_MODEL_TYPES:
            raise ProbeInputError(
                "config.model_type",
                f"the built-in decoder supports {', '.join(BUILTIN_MODEL_TYPES)}, "
                f"not {config['model_type']!r}",
            )
        notes.append("built with the probe's plain-torch llama-like decoder (no transformers)")
        if setup["method"] == "qlora":
            _qlora_kwargs(device)
        with _build_device(device):
            causal_lm = BuiltinCausalLM(text_config(config)).to(base_dtype(setup))
        if setup["attention"] == "eager":
            causal_lm.eager_attention = True

    causal_lm.train()
    if setup["method"] == "full":
        for p in causal_lm.parameters():
            p.requires_grad_(True)
        model: nn.Module = causal_lm
    else:
        for p in causal_lm.parameters():
            p.requires_grad_(False)
        model = _apply_lora(causal_lm, setup, notes)
    model.train()
    if setup["checkpointing"] != "none":
        enable_checkpointing(causal_lm, offload=setup["checkpointing"] == "offload")
    get_decoder: Callable[[], nn.Module] = causal_lm.get_decoder
    total, trainable = count_params(model)
    return BuiltModel(
        model=model,
        decoder=get_decoder(),
        lm_head=causal_lm.get_output_embeddings(),
        params_total=total,
        params_trainable=trainable,
        library=library,
        notes=notes,
    )
