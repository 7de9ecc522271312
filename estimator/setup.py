"""The training setup in the estimator's own terms (shared by CLI, REST and the probe)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from estimator.parallel.layout import parse_parallel, parse_wrap_units, wrap_text
from estimator.setup_choices import (
    AdapterDtype,
    Attention,
    Base,
    Checkpointing,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    PPSchedule,
    Precision,
    Sharding,
    StackName,
)
from estimator.stacks import OPTIONAL_OVERRIDES, OVERRIDES, load_stack

MAX_BATCH = 1_000_000
MAX_GPUS = 100_000
MAX_LORA_TARGETS = 64  # module-name patterns; real adapters name < 20 (issue 16: was unbounded)


class TrainingSetup(BaseModel):
    """How the model is trained. Field names are the CLI options in snake_case.

    precision: `mixed` = bf16 weights for compute plus fp32 master weights (full fine-tuning, the
    ZeRO paper's 16 bytes/parameter with Adam); `bf16` = pure bf16 weights and gradients, fp32
    optimizer states; `fp32` = everything fp32. For LoRA/QLoRA the frozen base is bf16 (QLoRA: NF4)
    and only the adapters follow `adapter_dtype` (peft's default keeps adapters in fp32).

    `stack` names the training framework (estimator/stacks/<stack>.json); every field of
    `estimator.stacks.OVERRIDES` left unset takes that stack's value, so a validated setup is
    fully resolved and its dump echoes what was assumed.
    """

    model_config = ConfigDict(extra="forbid")

    stack: StackName = "hf"
    method: Method = "full"
    lora_rank: int = Field(16, ge=1, le=65536)
    lora_alpha: float | None = Field(None, gt=0, le=1e6)
    lora_dropout: float | None = Field(None, ge=0, lt=1)
    lora_targets: list[str] = Field(
        default_factory=lambda: ["all-linear"], max_length=MAX_LORA_TARGETS
    )
    adapter_dtype: AdapterDtype = "fp32"
    optimizer: Optimizer = "adamw"
    precision: Precision = "mixed"
    checkpointing: Checkpointing = "gpu"  # placeholder: unset, the stack decides
    loss: Loss = "full"  # placeholder: unset, the stack decides
    loss_chunk: int | None = Field(None, ge=1, le=10**9)
    batch: int = Field(1, ge=1, le=MAX_BATCH)
    grad_accum: int | None = Field(None, ge=1, le=MAX_BATCH)
    autocast: bool | None = None
    optimizer_impl: OptimizerImpl | None = None
    paged: bool | None = None
    double_quant: bool | None = None
    train_embeddings: bool | None = None
    base: Base | None = None
    kbit_prepare: bool | None = None
    compile: bool | None = None
    # legacy: fsdp | zero1..3 are aliases of `parallel` (estimator/parallel/of_setup.py);
    # device_map splits the layers over the cards
    sharding: Sharding = "none"
    num_gpus: int = Field(1, ge=1, le=MAX_GPUS)
    attention: Attention = "sdpa"
    # multi-GPU layout (estimator/parallel/): `fsdp=8,tp=8`, `zero3`, `dp`, `hsdp`, ...
    parallel: str | None = Field(None, max_length=200)
    # FSDP unit: layer | block-of-N, + embeddings / lm_head as units of their own; unset: the
    # stack's (OPTIONAL_OVERRIDES), else `layer`
    fsdp_wrap: str = Field("layer", max_length=60)
    reshard_after_forward: bool = True
    offload: Offload = "none"  # ZeRO optimizer offload, FSDP / ZeRO-3 parameter offload
    pp_schedule: PPSchedule = "1f1b"  # pipeline schedule under pp=N
    pp_virtual: int | None = Field(None, ge=1, le=1024)  # interleaved: model chunks per rank

    @field_validator("parallel")
    @classmethod
    def _parallel_parses(cls, text: str | None) -> str | None:
        if text is None or not text.strip():
            return None
        if text.strip().lower() == "auto":  # min-gpus / recommend search the layouts
            return "auto"
        return parse_parallel(text).text

    @field_validator("fsdp_wrap")
    @classmethod
    def _wrap_parses(cls, text: str) -> str:
        return wrap_text(*parse_wrap_units(text))

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

    @model_validator(mode="after")
    def _resolve_from_stack(self) -> TrainingSetup:
        """Unset overrides take the stack's values; then the combinations are checked."""
        stack = load_stack(self.stack)
        for name in OVERRIDES:
            unset = name not in self.model_fields_set
            if getattr(self, name) is None or (name in ("checkpointing", "loss") and unset):
                setattr(self, name, stack.get(name))
        for name in OPTIONAL_OVERRIDES:
            if name not in self.model_fields_set:
                setattr(self, name, stack.get_optional(name, getattr(self, name)))
        if self.base is None:
            self.base = "nf4" if self.method == "qlora" else "bf16"
        _check_combinations(self)
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
        if adapter_config.get("lora_dropout") is not None:
            fields["lora_dropout"] = adapter_config["lora_dropout"]
        if adapter_config.get("modules_to_save"):
            fields["train_embeddings"] = True
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


def _check_combinations(s: TrainingSetup) -> None:
    """Combinations no stack can run; the message starts with the field at fault."""
    if s.method == "qlora" and s.base != "nf4":
        raise ValueError(f"base: qlora quantizes the base to nf4; for {s.base} use method lora")
    if s.method == "full" and s.base != "bf16":
        raise ValueError(f"base: {s.base} weights are frozen; full fine-tuning needs base bf16")
    if s.base == "nf4" and s.method == "lora":
        s.method = "qlora"
    if s.optimizer_impl == "in-backward" and (s.grad_accum or 1) > 1:
        raise ValueError(
            "optimizer_impl: in-backward steps each parameter during the backward and frees its "
            "gradient, so it needs grad_accum 1 (torchtune recipes/configs/llama3_1/"
            "8B_full_single_device.yaml:66)"
        )
    _check_pipeline(s)
    if s.paged and s.optimizer not in ("adamw", "adamw-8bit", "lion"):
        raise ValueError(
            f"paged: bitsandbytes has paged adamw, adamw-8bit and lion only, not {s.optimizer}"
        )
    if s.checkpointing == "selective" and load_stack(s.stack).get("selective_saves") is None:
        s_name = s.stack
        raise ValueError(
            f"checkpointing: selective (per-op) checkpointing is torchtitan's; stack {s_name} "
            "checkpoints whole layers (use --stack torchtitan)"
        )


def _check_pipeline(s: TrainingSetup) -> None:
    """A schedule other than the default needs pipeline stages; virtual stages need the
    interleaved schedule (torch pipelining: only the looped schedules take several stages per
    rank, schedules.py PipelineScheduleMulti)."""
    if s.pp_virtual is not None and s.pp_schedule != "interleaved-1f1b":
        raise ValueError(
            f"pp_virtual: virtual stages per rank need pp_schedule interleaved-1f1b, "
            f"not {s.pp_schedule}"
        )
    if s.pp_schedule == "1f1b" or s.parallel == "auto":
        return
    if s.parallel is None or parse_parallel(s.parallel).pp == 1:
        raise ValueError(
            f"pp_schedule: {s.pp_schedule} schedules pipeline stages; give parallel with pp=N "
            "(N > 1), e.g. fsdp,pp=4"
        )
