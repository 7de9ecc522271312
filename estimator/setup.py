"""The training setup in the estimator's own terms (shared by CLI, REST and the probe)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Method = Literal["full", "lora", "qlora"]
Optimizer = Literal["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
Precision = Literal["mixed", "bf16", "fp32"]
Checkpointing = Literal["none", "gpu", "offload"]
Loss = Literal["full", "chunked"]
Sharding = Literal["none", "fsdp", "zero1", "zero2", "zero3", "device_map"]
Attention = Literal["sdpa", "flash", "eager"]
AdapterDtype = Literal["fp32", "bf16"]

MAX_BATCH = 1_000_000
MAX_GPUS = 100_000
MAX_LORA_TARGETS = 64  # module-name patterns; real adapters name < 20 (issue 16: was unbounded)


class TrainingSetup(BaseModel):
    """How the model is trained. Field names are the CLI options in snake_case.

    precision: `mixed` = bf16 weights for compute plus fp32 master weights (full fine-tuning, the
    ZeRO paper's 16 bytes/parameter with Adam); `bf16` = pure bf16 weights and gradients, fp32
    optimizer states; `fp32` = everything fp32. For LoRA/QLoRA the frozen base is bf16 (QLoRA: NF4)
    and only the adapters follow `adapter_dtype` (peft's default keeps adapters in fp32).
    """

    model_config = ConfigDict(extra="forbid")

    method: Method = "full"
    lora_rank: int = Field(16, ge=1, le=65536)
    lora_alpha: float | None = Field(None, gt=0, le=1e6)
    lora_targets: list[str] = Field(
        default_factory=lambda: ["all-linear"], max_length=MAX_LORA_TARGETS
    )
    adapter_dtype: AdapterDtype = "fp32"
    optimizer: Optimizer = "adamw"
    precision: Precision = "mixed"
    checkpointing: Checkpointing = "gpu"
    loss: Loss = "full"
    loss_chunk: int = Field(4096, ge=1, le=10**9)
    batch: int = Field(1, ge=1, le=MAX_BATCH)
    sharding: Sharding = "none"
    num_gpus: int = Field(1, ge=1, le=MAX_GPUS)
    attention: Attention = "sdpa"

    @field_validator("lora_targets")
    @classmethod
    def _targets_not_empty(cls, targets: list[str]) -> list[str]:
        cleaned = [t.strip() for t in targets if t.strip()]
        if not cleaned:
            raise ValueError("give at least one target module name, or 'all-linear'")
        return cleaned

    @model_validator(mode="after")
    def _sharding_needs_gpus(self) -> TrainingSetup:
        if self.sharding == "none" and self.num_gpus > 1:
            self.sharding = "device_map"
        return self

    @property
    def is_adapter(self) -> bool:
        return self.method in ("lora", "qlora")

    @classmethod
    def from_adapter_config(
        cls, adapter_config: dict[str, object], **overrides: object
    ) -> TrainingSetup:
        """Read rank and targets from a PEFT `adapter_config.json` (fields `r`, `lora_alpha`,
        `target_modules`: a list or the string 'all-linear')."""
        fields: dict[str, object] = {"method": "lora"}
        if "r" in adapter_config:
            fields["lora_rank"] = adapter_config["r"]
        if adapter_config.get("lora_alpha") is not None:
            fields["lora_alpha"] = adapter_config["lora_alpha"]
        targets = adapter_config.get("target_modules")
        if isinstance(targets, str):
            fields["lora_targets"] = [targets]
        elif isinstance(targets, list):
            fields["lora_targets"] = [str(t) for t in targets]
        fields.update(overrides)
        return cls.model_validate(fields)
