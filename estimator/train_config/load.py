"""Read training configs: parse YAML/JSON, detect the format, map it, follow companion files.

Detection (first match wins; `fmt` given explicitly skips it):
1. PEFT adapter config: `peft_type` at the top (`peft.py`);
2. torchtune: `model` or `tokenizer` is a mapping with `_component_`;
3. accelerate: `distributed_type` or `compute_environment` at the top;
4. DeepSpeed: `zero_optimization` or `train_micro_batch_size_per_gpu` at the top;
5. axolotl: `base_model` at the top;
6. LLaMA-Factory: `model_name_or_path` with a key only LLaMA-Factory uses (`stage`,
   `finetuning_type`, `cutoff_len`, `lora_rank`, ...: `llamafactory.LF_KEYS`), or its v1 format:
   `model` as a name with a v1-only key (`peft_config`, `micro_batch_size`, ...:
   `llamafactory_v1.V1_KEYS`);
7. TRL `SFTConfig` / HF `TrainingArguments`: any of their keys (`per_device_train_batch_size`,
   `gradient_accumulation_steps`, `optim`, `output_dir`, `max_length`, ...).

A `deepspeed:` key holding a file path (axolotl, HF, LLaMA-Factory; LLaMA-Factory v1:
`dist_config.config_file`) is followed, relative to the
config's folder first (only for a config read from a file: the text of a config sent to the
service names no file that is read, and no local model path); further files (a DeepSpeed JSON,
an accelerate config) may be given after the first and are merged over it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.train_config.axolotl import read_axolotl
from estimator.train_config.hf_args import read_hf
from estimator.train_config.llamafactory import LF_KEYS, read_llamafactory
from estimator.train_config.llamafactory_v1 import is_v1
from estimator.train_config.peft import read_peft
from estimator.train_config.result import TrainConfigMapping
from estimator.train_config.sharding import read_accelerate, read_deepspeed
from estimator.train_config.torchtune import read_torchtune
from estimator.train_config.trl_dpo import is_dpo_config
from estimator.train_config.trl_preference import preference_trainer

FIELD = "train_config"
MAX_BYTES = 2 * 2**20
FORMATS = ("axolotl", "llamafactory", "torchtune", "trl", "deepspeed", "accelerate", "peft")
HF_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "optim",
    "output_dir",
    "max_length",
    "max_seq_length",
    "packing",
    "bf16",
    "gradient_checkpointing",
    "num_train_epochs",
    # TrainingArguments / TRL script keys that the TRL CLI's example config starts with (trl
    # examples/cli_configs/example_config.yaml: model_name_or_path, dataset_name, learning_rate)
    "learning_rate",
    "lr_scheduler_type",
    "dataset_name",
    "use_peft",
)
Reader = Callable[[dict[str, Any], Path | None], TrainConfigMapping]
READERS: dict[str, Reader] = {
    "axolotl": read_axolotl,
    "llamafactory": read_llamafactory,
    "torchtune": read_torchtune,
    "trl": read_hf,
    "deepspeed": lambda data, _dir: read_deepspeed(data),
    "accelerate": lambda data, _dir: read_accelerate(data),
    "peft": read_peft,
}


def parse_text(text: str, name: str = "config", field: str = FIELD) -> dict[str, Any]:
    """A YAML or JSON mapping (JSON is YAML; a `.json` name is parsed as JSON for its errors)."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise EstimatorInputError(field, f"{name} is larger than {MAX_BYTES // 2**20} MiB")
    try:
        if name.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise EstimatorInputError(field, f"{name}: not valid JSON ({err})") from None
    except ImportError:
        raise EstimatorInputError(field, "YAML configs need PyYAML (pip install pyyaml)") from None
    except Exception as err:  # yaml.YAMLError and its subclasses
        raise EstimatorInputError(field, f"{name}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise EstimatorInputError(field, f"{name}: expected a mapping of options at the top")
    return data


def detect_format(data: dict[str, Any]) -> str | None:
    def has_component(key: str) -> bool:
        value = data.get(key)
        return isinstance(value, dict) and "_component_" in value

    if "peft_type" in data:  # every PeftConfig.to_dict() has it (peft src/peft/config.py:89)
        return "peft"
    if has_component("model") or has_component("tokenizer"):
        return "torchtune"
    if "distributed_type" in data or "compute_environment" in data:
        return "accelerate"
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
        return "deepspeed"
    if "base_model" in data:
        return "axolotl"
    if "model_name_or_path" in data and any(k in data for k in LF_KEYS):
        return "llamafactory"
    if is_v1(data):
        return "llamafactory"
    if any(k in data for k in HF_KEYS) or is_dpo_config(data) or preference_trainer(data):
        return "trl"
    return None


def map_config(
    data: dict[str, Any],
    fmt: str | None = None,
    base_dir: Path | None = None,
    name: str = "config",
) -> TrainConfigMapping:
    """Map one parsed config; `fmt` forces a format (one of FORMATS, `hf` = `trl`)."""
    kind = "trl" if fmt == "hf" else (fmt or detect_format(data))
    if kind is None:
        raise EstimatorInputError(
            FIELD,
            f"{name}: not recognised as {', '.join(FORMATS)} (no key such as base_model, "
            f"model_name_or_path, model._component_, per_device_train_batch_size)",
        )
    if kind not in READERS:
        raise EstimatorInputError(FIELD, f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    mapping = READERS[kind](data, base_dir)
    mapping.sources.append(name)
    ds, ds_key = data.get("deepspeed"), "deepspeed"
    dist = data.get("dist_config")
    if kind == "llamafactory" and isinstance(dist, dict) and dist.get("name") == "deepspeed":
        ds, ds_key = dist.get("config_file"), "dist_config.config_file"  # LLaMA-Factory v1
        if not ds:
            mapping.ignore(ds_key, "no DeepSpeed JSON named: its ZeRO settings are unread")
    if kind != "deepspeed" and isinstance(ds, dict):
        mapping.merge(_named(read_deepspeed(ds), f"{name}:deepspeed"))
    elif kind != "deepspeed" and isinstance(ds, str) and ds:
        _follow_deepspeed(mapping, ds, base_dir, ds_key)
    return mapping


def _named(m: TrainConfigMapping, name: str) -> TrainConfigMapping:
    m.sources.append(name)
    return m


def _follow_deepspeed(
    mapping: TrainConfigMapping, ref: str, base_dir: Path | None, key: str = "deepspeed"
) -> None:
    """A `deepspeed:` file path, beside the config first. Without `base_dir` (a config's text
    sent to the service) no file is read: the service must not open paths a request names."""
    if base_dir is None:
        mapping.ignore(
            key,
            f"file {ref!r} is not read from a config sent as text: give the DeepSpeed settings "
            "inline (`deepspeed:` as a mapping)",
        )
        return
    candidates = [Path(ref)]
    if not Path(ref).is_absolute():
        candidates.insert(0, base_dir / ref)
    for path in candidates:
        if path.is_file():
            mapping.merge(read_file(path, "deepspeed"))
            return
    mapping.ignore(key, f"file {ref!r} not found beside the config; ZeRO settings unread")


def read_file(path: str | Path, fmt: str | None = None) -> TrainConfigMapping:
    p = Path(path)
    if not p.is_file():
        raise EstimatorInputError(FIELD, f"no such file {str(p)!r}")
    if p.stat().st_size > MAX_BYTES:
        raise EstimatorInputError(FIELD, f"{p} is larger than {MAX_BYTES // 2**20} MiB")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise EstimatorInputError(FIELD, f"{p} is not UTF-8 text") from None
    except OSError as err:
        raise EstimatorInputError(FIELD, f"cannot read {p}: {err.strerror}") from None
    return map_config(parse_text(text, p.name), fmt, p.parent, str(p))


def read_train_configs(
    paths: Sequence[str | Path], adapter: str | Path | None = None
) -> TrainConfigMapping:
    """The first file is the training config; the others (DeepSpeed JSON, accelerate YAML) are
    merged over it in order. `adapter`: a PEFT adapter_config.json (`--adapter-config`), read as
    format `peft`; it fills what the training configs do not state."""
    if not paths and adapter is None:
        raise EstimatorInputError(FIELD, "give at least one file")
    peft = read_file(adapter, "peft") if adapter is not None else None
    if not paths:
        assert peft is not None
        return peft
    mapping = read_file(paths[0])
    for extra in paths[1:]:
        mapping.merge(read_file(extra))
    if peft is not None:
        mapping.fill_from(peft)
    return mapping


def read_train_config_text(text: str, fmt: str | None = None) -> TrainConfigMapping:
    """REST: the config's text and optionally its format (`axolotl`, ..., or `json`/`yaml`)."""
    name = "train_config.json" if fmt == "json" else "train_config"
    return map_config(parse_text(text, name), None if fmt in (None, "json", "yaml") else fmt)
