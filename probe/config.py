"""Reading and checking a model `config.json` (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from probe.options import ProbeInputError

__all__ = ["load_config", "check_config", "text_config", "BUILTIN_MODEL_TYPES"]

# Shapes the built-in plain-torch decoder can build when transformers is absent (llama-like).
BUILTIN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# Fields that must be positive integers when present.
_POSITIVE = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "head_dim",
    "n_embd",
    "n_layer",
    "n_head",
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
)
_SIZE_WORDS = ("size", "num_", "n_", "dim", "layers", "heads", "experts")


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json; raises `ProbeInputError` naming `config` on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProbeInputError("config", f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeInputError("config", f"cannot read {p}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeInputError(
            "config", f"{p} is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    return check_config(data)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's part of a config: `text_config` for multimodal ones (qwen3_5), else itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def _check_sizes(cfg: dict[str, Any], prefix: str) -> None:
    for key, value in cfg.items():
        field = f"{prefix}{key}"
        if key in _POSITIVE and value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ProbeInputError(field, f"expected a positive integer, got {value!r}")
            if value < 1:
                raise ProbeInputError(field, f"must be >= 1, got {value}")
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value < 0
            and any(w in key for w in _SIZE_WORDS)
        ):
            raise ProbeInputError(field, f"must not be negative, got {value}")


def check_config(data: object) -> dict[str, Any]:
    """Check the fields the probe relies on; returns the config unchanged."""
    if not isinstance(data, dict):
        raise ProbeInputError("config", "config.json must hold a JSON object")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ProbeInputError("config.model_type", "missing (every config.json names its type)")
    known = _known_model_types()
    if known is not None and model_type not in known:
        raise ProbeInputError("config.model_type", f"unknown model type {model_type!r}")
    if known is None and model_type not in BUILTIN_MODEL_TYPES:
        raise ProbeInputError(
            "config.model_type",
            f"{model_type!r} needs transformers; without it only "
            f"{', '.join(BUILTIN_MODEL_TYPES)} are built in",
        )
    _check_sizes(data, "config.")
    inner = data.get("text_config")
    if inner is not None:
        if not isinstance(inner, dict):
            raise ProbeInputError("config.text_config", "must be an object")
        _check_sizes(inner, "config.text_config.")
    text = text_config(data)
    prefix = "config.text_config." if text is not data else "config."
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        alt = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer"}.get(key)
        if key not in text and (alt is None or alt not in text):
            raise ProbeInputError(prefix + key, "missing")
    return data


def _known_model_types() -> set[str] | None:
    """Model types transformers can build, or None when transformers is not installed."""
    try:
        from transformers import CONFIG_MAPPING
    except Exception:  # noqa: BLE001 - any import problem means "no transformers"
        return None
    return set(CONFIG_MAPPING.keys())
