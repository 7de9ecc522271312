"""The training setup in the estimator's own terms (shared by CLI, REST and the probe)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from estimator.setup_choices import (
    AdapterDtype,
    Attention,
    Base,
    Checkpointing,
    Loss,
    Method,
    Objective,
    Offload,
    Optimizer,
    OptimizerImpl,
    PPSchedule,
    Precision,
    Sharding,
    StackName,
)
from estimator.setup_rules import (
    MAX_BATCH,
    MAX_GPUS,
    MAX_LORA_TARGETS,
    parallel_field,
    resolve_from_stack,
    sharding_needs_gpus,
    targets_field,
    wrap_field,
)


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
    # `dpo`: TRL's DPOTrainer, `batch` preference pairs a micro-batch, each a chosen and a
    # rejected sequence of up to `seq` tokens, and a reference forward each step;
    # `dpo-precomputed`: the reference log-probabilities computed before training; `loss`
    # chunked is TRL 1.16's fused head, full TRL 1.0-1.9's full logits; `orpo`, `cpo`, `simpo`:
    # TRL 1.0-1.9's ORPOTrainer, CPOTrainer, CPOTrainer with cpo_alpha 0, pairs as DPO's, no
    # reference, the full logits; `kto`: its KTOTrainer, `batch` unpaired labelled completions
    # (at least 2), reference and KL forwards each step (estimator/objective.py)
    objective: Objective = "sft"
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
    # the rows of a micro-batch carry padding (batch > 1 without packing, or padding to a fixed
    # length): the attention mask has zeros, so transformers builds a (b, 1, s, s) mask for
    # SDPA (estimator/memory/model.py `mask_rule`); False: every row is real tokens
    padded_batches: bool = False
    grad_accum: int | None = Field(None, ge=1, le=MAX_BATCH)
    # rows per device of the evaluation pass the run makes between steps (transformers'
    # per_device_eval_batch_size, axolotl's eval_batch_size, torchtune's batch_size_val), at
    # the training length; None: no evaluation priced (estimator/memory/evaluation.py)
    eval_batch: int | None = Field(None, ge=1, le=MAX_BATCH)
    # the evaluation's Liger loss skips the logits too (TRL's SFTTrainer passes skip_logits in
    # evaluation: estimator/memory/evaluation.py); needs `eval_batch` and loss `liger`
    eval_skip_logits: bool = False
    autocast: bool | None = None
    optimizer_impl: OptimizerImpl | None = None
    paged: bool | None = None
    double_quant: bool | None = None
    train_embeddings: bool | None = None
    base: Base | None = None
    kbit_prepare: bool | None = None
    compile: bool | None = None
    # Liger's RMSNorm, SwiGLU and RoPE kernels (transformers' use_liger_kernel, axolotl's
    # liger_rms_norm + liger_glu_activation): estimator/memory/liger.py
    liger_kernels: bool | None = None
    # a quantized base also stores the fused 3-D expert banks in 4 bits (axolotl's
    # quantize_moe_experts); unset, the stack decides (transformers 5 + bnb: nn.Linear only)
    quantize_experts: bool | None = None
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
        return parallel_field(text)

    @field_validator("fsdp_wrap")
    @classmethod
    def _wrap_parses(cls, text: str) -> str:
        return wrap_field(text)

    @field_validator("lora_targets")
    @classmethod
    def _targets_not_empty(cls, targets: list[str]) -> list[str]:
        return targets_field(targets)

    @model_validator(mode="after")
    def _sharding_needs_gpus(self) -> TrainingSetup:
        sharding_needs_gpus(self)
        return self

    @model_validator(mode="after")
    def _resolve_from_stack(self) -> TrainingSetup:
        """Unset overrides take the stack's values; then the combinations are checked."""
        resolve_from_stack(self, self.model_fields_set)
        return self

    @property
    def is_adapter(self) -> bool:
        return self.method in ("lora", "qlora")
