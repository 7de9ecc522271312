"""The rules of a training setup that are not field types: the parsed forms of `parallel`,
`fsdp_wrap` and `lora_targets`, the fields a stack resolves, and the combinations no stack can
run. Plain functions of the setup's values (no pydantic), shared by the pydantic model
(`estimator.setup.TrainingSetup`, whose validators call them) and the command line's plain
validation (`estimator.plain_request`), so that the two apply one set of rules."""

from __future__ import annotations

from typing import Any

from estimator.lora import PEFT_DEFAULT, REGEX
from estimator.objective import FULL_LOGITS_ONLY, PREFERENCE, TRAINERS, smallest_batch
from estimator.parallel.layout import model_splits, parse_parallel, parse_wrap_units, wrap_text
from estimator.stacks import OPTIONAL_OVERRIDES, OVERRIDES, load_stack

MAX_BATCH = 1_000_000
MAX_GPUS = 100_000
MAX_LORA_TARGETS = 64  # module-name patterns; real adapters name < 20 (issue 16: was unbounded)


def parallel_field(text: str | None) -> str | None:
    """`parallel` in its canonical spelling; None for none or blank, `auto` for the search."""
    if text is None or not text.strip():
        return None
    if text.strip().lower() == "auto":  # min-gpus / recommend search the layouts
        return "auto"
    return parse_parallel(text).text


def wrap_field(text: str) -> str:
    """`fsdp_wrap` in its canonical spelling."""
    return wrap_text(*parse_wrap_units(text))


def targets_field(targets: list[str]) -> list[str]:
    cleaned = [t.strip() for t in targets if t.strip()]
    if not cleaned:
        raise ValueError("give at least one target module name, or 'all-linear'")
    if PEFT_DEFAULT in cleaned and len(cleaned) > 1:
        raise ValueError(f"{PEFT_DEFAULT!r} (peft's targets for the model type) stands alone")
    for target in cleaned:
        if target.startswith(REGEX):  # peft's regex `target_modules`
            _check_pattern(target)
    return cleaned


MAX_PATTERN_CHARS = 1000


def _check_pattern(target: str) -> None:
    import regex

    pattern = target[len(REGEX) :]
    if not pattern or len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"a re: target holds a pattern of 1 to {MAX_PATTERN_CHARS} characters")
    try:
        regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"{target[:80]!r} is not a regular expression: {err}") from None


def sharding_needs_gpus(s: Any) -> None:
    if s.sharding == "none" and s.num_gpus > 1:
        s.sharding = "device_map"


def resolve_from_stack(s: Any, fields_set: set[str]) -> None:
    """Unset overrides take the stack's values (`fields_set`: the fields the input gave); then
    the combinations are checked."""
    stack = load_stack(s.stack)
    asked_experts = "quantize_experts" in fields_set  # setting a field adds it to the set
    asked_adapter = "adapter_dtype" in fields_set
    asked_padding = "padded_batches" in fields_set
    asked_loss = "loss" in fields_set and s.loss is not None
    if "batch" not in fields_set:
        s.batch = smallest_batch(s.objective)  # KTO's KL term needs two rows (objective.py)
    for name in OVERRIDES:
        unset = name not in fields_set
        if getattr(s, name) is None or (name in ("checkpointing", "loss") and unset):
            setattr(s, name, stack.get(name))
    if s.objective in FULL_LOGITS_ONLY and not asked_loss:
        s.loss = "full"  # ORPOTrainer / CPOTrainer read the full logits (estimator/objective)
    for name in OPTIONAL_OVERRIDES:
        if name not in fields_set:
            setattr(s, name, stack.get_optional(name, getattr(s, name)))
    if s.method == "full" and "precision" not in fields_set:  # Unsloth trains bf16 weights
        s.precision = stack.get_optional("full_precision", s.precision)
    if s.base is None:
        s.base = "nf4" if s.method == "qlora" else "bf16"
    if not asked_adapter and s.base in ("nf4", "int8") and s.loss == "chunked":
        # the stack's trainer casts a quantized model's adapters (TRL's SFTTrainer, hf.json)
        s.adapter_dtype = stack.get_optional("quantized_adapter_dtype", s.adapter_dtype)
    if s.objective in PREFERENCE and not asked_padding:
        s.padded_batches = True  # chosen and rejected padded to the longer (estimator/objective)
    check_combinations(s)
    if asked_experts and s.quantize_experts and not stack.get("quantize_experts"):
        check_quantized_experts(s, stack)  # a dumped setup echoes the stack's own value


def check_quantized_experts(s: Any, stack: Any) -> None:
    """`quantize_experts` asked for: a quantized base (NF4 under qlora, int8 under lora with
    `base: int8`) on a stack whose expert banks bitsandbytes' parametrization dequantizes (the
    stack's `experts_dequant`: axolotl 067b021c monkeypatch/moe_quant.py:108-131 quantizes each
    3-D expert parameter on load, with `replace_parameter_4bit` under load_in_4bit and its own
    int8 parametrization under load_in_8bit); the message names the field."""
    if s.base not in ("nf4", "int8"):
        raise ValueError(
            f"quantize_experts: only a quantized base stores its expert banks quantized (qlora's "
            f"NF4, or lora with base int8); base {s.base} keeps them in the load dtype"
        )
    if stack.get_optional("experts_dequant", None) is None:
        raise ValueError(
            f"quantize_experts: stack {s.stack} has no quantized expert banks (axolotl's "
            "quantize_moe_experts runs transformers' models: use --stack hf or deepspeed)"
        )


# the losses whose evaluation pass estimator/memory/evaluation.py models (their evaluation
# paths were read: transformers' loss, TRL's chunked_nll, torchtune's chunked output, Liger's
# lce_forward, Unsloth's fused loss, Cut Cross-Entropy's patched forward in axolotl's fork)
EVAL_LOSSES = ("full", "chunked", "liger", "unsloth", "cce")


def eval_loss_unmodelled(loss: str) -> str | None:
    """Why an evaluation pass under `loss` is not priced, or None (`EVAL_LOSSES`)."""
    if loss in EVAL_LOSSES:
        return None
    return (
        f"the evaluation pass of the {loss} loss is not modelled (its evaluation path was not "
        f"read; modelled: {', '.join(EVAL_LOSSES)})"
    )


def eval_split_unmodelled(layout: Any) -> str | None:
    """Why an evaluation pass under `layout` (parsed or resolved) is not priced, or None: a
    tp / pp / cp / ep split of the model."""
    split = model_splits(layout)
    if not split:
        return None
    return (
        f"an evaluation pass under {', '.join(split)} is not modelled (priced on one card, "
        "under data parallelism or device_map)"
    )


def stated_layout(s: Any) -> Any:
    """The `parallel` layout the setup states, parsed; None for none or `auto` (the layout
    search picks one)."""
    if not s.parallel or s.parallel == "auto":
        return None
    return parse_parallel(s.parallel)


def check_evaluation(s: Any) -> None:
    """`eval_batch` where its pass is modelled: those losses, one card, data parallelism or
    device_map (an evaluation's logits under tp / pp / cp / ep are not)."""
    if s.eval_skip_logits:
        if s.eval_batch is None:
            raise ValueError(
                "eval_skip_logits: no evaluation pass to skip logits in (set eval_batch)"
            )
        if s.loss != "liger":
            raise ValueError(
                f"eval_skip_logits: only Liger's fused loss can skip the logits (loss is {s.loss})"
            )
    if s.eval_batch is None:
        return
    reason = eval_loss_unmodelled(s.loss)
    layout = stated_layout(s)
    if reason is None and layout is not None:
        reason = eval_split_unmodelled(layout)
    if reason is not None:
        raise ValueError(f"eval_batch: {reason}")


def check_combinations(s: Any) -> None:
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
    check_pipeline(s)
    check_evaluation(s)
    check_objective(s)
    if s.liger_kernels and s.stack not in ("hf", "deepspeed"):
        raise ValueError(
            f"liger_kernels: Liger patches transformers' model classes; stack {s.stack} runs "
            "its own modules (use --stack hf or deepspeed)"
        )
    if s.attention == "xformers" and s.stack != "unsloth":
        raise ValueError(
            f"attention: xformers is Unsloth's backend (unsloth utils/attention_dispatch.py "
            f"select_attention_backend); stack {s.stack} runs transformers' attention "
            "(use sdpa, flash or eager, or --stack unsloth)"
        )
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


# where each trainer of FULL_LOGITS_ONLY reads the model's logits (trl v1.8.0)
FULL_LOGITS_READ = {
    "KTOTrainer": "trl/trainer/kto_trainer.py:1493-1496",
    "ORPOTrainer": "trl/experimental/orpo/orpo_trainer.py:780-810",
    "CPOTrainer": "trl/experimental/cpo/cpo_trainer.py:823-851",
}


def check_objective(s: Any) -> None:
    """A preference objective where it is modelled (estimator/objective.py): TRL's trainers on
    the hf stack, on one card or a data-parallel layout, without an evaluation pass. DPOTrainer
    with 1.16.0's fused LM head (`loss chunked`) or 1.0-1.9's full logits (`loss full`,
    axolotl's pin); KTOTrainer, ORPOTrainer and CPOTrainer (`kto`, `orpo`, `cpo`, `simpo`) with
    the full logits."""
    if s.objective not in PREFERENCE:
        return
    trainer = TRAINERS[s.objective]
    if s.stack != "hf":
        raise ValueError(
            f"objective: {s.objective} is modelled for TRL's {trainer} (--stack hf); "
            f"stack {s.stack}'s preference training was not read"
        )
    if s.objective in FULL_LOGITS_ONLY and s.loss != "full":
        raise ValueError(
            f"loss: TRL's {trainer} computes the log-probabilities from the full logits the "
            f"model returns (trl v1.8.0 {FULL_LOGITS_READ[trainer]}): loss full, not {s.loss}"
        )
    if s.batch < smallest_batch(s.objective):
        raise ValueError(
            f"batch: {trainer}'s KL term needs micro-batches of at least "
            f"{smallest_batch(s.objective)} rows (trl v1.8.0 trainer/kto_trainer.py:785-789 "
            "raises below that)"
        )
    if s.loss not in ("chunked", "full"):
        raise ValueError(
            f"loss: DPOTrainer computes the log-probabilities through TRL 1.16.0's fused LM head "
            f"(trainer/dpo_trainer.py:959, 1299: loss chunked) or, up to TRL 1.9, from the full "
            f"logits (v1.8.0 trainer/dpo_trainer.py:1289-1296: loss full), not {s.loss}"
        )
    if s.eval_batch is not None:
        raise ValueError(
            f"eval_batch: the evaluation pass of {trainer} (its policy and reference "
            "forwards) is not modelled"
        )
    layout = stated_layout(s)
    split = model_splits(layout) if layout is not None else []
    if split:
        raise ValueError(
            f"parallel: {s.objective} under {', '.join(split)} is not modelled (TRL's "
            f"{trainer} runs data parallelism: FSDP, DeepSpeed ZeRO or DDP)"
        )


def check_pipeline(s: Any) -> None:
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
