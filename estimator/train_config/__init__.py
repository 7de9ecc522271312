"""Training configs in: axolotl, LLaMA-Factory, torchtune, TRL/HF TrainingArguments, DeepSpeed
JSON and accelerate configs, mapped to trainfit's request fields (see `load` for detection)."""

from estimator.train_config.load import (
    FORMATS,
    detect_format,
    map_config,
    parse_text,
    read_file,
    read_train_config_text,
    read_train_configs,
)
from estimator.train_config.result import Ignored, TrainConfigMapping, split_supported

__all__ = [
    "FORMATS",
    "Ignored",
    "TrainConfigMapping",
    "detect_format",
    "map_config",
    "parse_text",
    "read_file",
    "read_train_config_text",
    "read_train_configs",
    "split_supported",
]
