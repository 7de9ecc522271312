"""The values each `TrainingSetup` field may take, as `Literal` types. A module of its own (it
imports only `typing`) so that the command line can list the choices in `--help` without
loading pydantic; `estimator.setup` builds the model from these."""

from __future__ import annotations

from typing import Literal

Method = Literal["full", "lora", "qlora"]
Optimizer = Literal["adamw", "adamw-8bit", "adamw-4bit", "sgd", "sgd-momentum", "adafactor", "lion"]
Precision = Literal["mixed", "bf16", "fp32"]
Checkpointing = Literal["none", "gpu", "offload", "selective"]
Loss = Literal["full", "chunked", "liger", "cce", "unsloth"]
StackName = Literal[
    "hf", "unsloth", "torchtune", "torchtitan", "torchtitan-2024", "deepspeed", "probe"
]
OptimizerImpl = Literal["fused", "foreach", "in-backward"]
Base = Literal["bf16", "int8", "nf4"]
Sharding = Literal["none", "fsdp", "zero1", "zero2", "zero3", "device_map"]
Attention = Literal["sdpa", "flash", "eager", "xformers"]
Offload = Literal["none", "optimizer", "params"]
PPSchedule = Literal["1f1b", "interleaved-1f1b", "gpipe"]  # estimator/parallel/schedule.py
AdapterDtype = Literal["fp32", "bf16"]
# the training objective (estimator/objective.py): supervised fine-tuning, or TRL's DPOTrainer
# with the reference log-probabilities computed each step or precomputed before training
Objective = Literal["sft", "dpo", "dpo-precomputed", "kto", "orpo", "cpo", "simpo"]
