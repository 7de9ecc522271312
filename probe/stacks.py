"""Which training stack runs the probe's steps, and what each can run on this machine.

- `probe`: the probe's own loop (probe.runner), kept for regression: bf16 weights with its own
  fp32 masters, no autocast, foreach AdamW (fused on request), dropout 0, no gradient
  accumulation.
- `hf`: transformers `Trainer` + peft (+ bitsandbytes for QLoRA / 8-bit AdamW), see
  probe.hf_stack; with loss=chunked TRL's `SFTTrainer` and its fused LM head (probe.trl_stack).
  Runs on the CPU, under fake tensors and on CUDA.
- `torchtune`: torchtune's own single-device recipes (LoRA, QLoRA, full), see
  probe.torchtune_stack.
  Runs on the CPU, under fake tensors (a fake checkpointer) and on CUDA.
- `torchtitan`: torchtitan's own Trainer (FSDP2 under gloo, CPU), see probe.torchtitan_stack;
  the CLI hands the run to it. Under fake tensors with torchtitan's fake_backend (`--device
  fake --ranks N`, probe.torchtitan_fake).
- `unsloth`, `deepspeed`: not runnable by this probe; `check_stack`
  says why (exit 2 on the command line) instead of substituting another stack's numbers.

`check_stack` raises `ProbeInputError` naming the field for a setup the chosen stack cannot run,
so the CLI exits 2 with the reason.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from probe.options import ProbeInputError

# the preference objectives the probe measures, each through the installed TRL's own trainer
PREFERENCE_TRAINERS = {
    "dpo": "DPOTrainer",
    "kto": "KTOTrainer",
    "orpo": "ORPOTrainer",
    "cpo": "CPOTrainer",
    "simpo": "CPOTrainer",
}

# trl 1.16.0 trl/kernels/chunked_logprob.py:31 TOKEN_CHUNK_SIZE: the fused LM head's tile
TRL_TOKEN_TILE = 4096

__all__ = ["check_stack", "NOT_RUNNABLE"]

# Stacks the probe cannot run, with the reason found when trying (see the closing note of
# issue 11). A stack is reported, never replaced by another.
NOT_RUNNABLE: dict[str, str] = {
    "unsloth": "Unsloth needs a GPU: `import unsloth` raises 'Unsloth cannot find any torch "
    "accelerator? You need a GPU.' (unsloth_zoo/device_type.py) and its kernels are triton, so "
    "it cannot run on the CPU or under fake tensors",
    "deepspeed": "DeepSpeed's ZeRO engine needs a CUDA (or other accelerator) backend and its "
    "compiled ops; not run by this probe",
}


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _check_probe_stack(setup: dict[str, Any]) -> None:
    """The probe's own loop has none of the stack options; they need `--stack hf`."""
    fixed = {
        "autocast": False,
        "paged": False,
        "lora_dropout": 0.0,
        "grad_accum": 1,
        "double_quant": False,
    }
    for key, value in fixed.items():
        if setup[key] != value:
            raise ProbeInputError(
                f"setup.{key}",
                f"the probe stack (the probe's own loop) runs only {key}={value!r}; "
                f"got {setup[key]!r}: use --stack hf",
            )
    if setup["loss"] == "liger":
        raise ProbeInputError("setup.loss", "loss=liger needs --stack hf on a CUDA GPU")
    # foreach (the default) or torch's fused AdamW (probe.optim.make_optimizer)
    impl = setup["optimizer_impl"]
    if impl != "foreach" and not (impl == "fused" and setup["optimizer"] == "adamw"):
        raise ProbeInputError(
            "setup.optimizer_impl",
            f"the probe stack (the probe's own loop) runs foreach, or fused with AdamW; got "
            f"{impl!r} with optimizer {setup['optimizer']!r}: use --stack hf or torchtune",
        )


def _check_hf_stack(setup: dict[str, Any], device: str) -> None:
    if not _has("transformers"):
        raise ProbeInputError("setup.stack", "the hf stack needs transformers installed")
    if setup["method"] != "full" and not _has("peft"):
        raise ProbeInputError("setup.method", f"{setup['method']} on the hf stack needs peft")
    needs_bnb = setup["method"] == "qlora" or setup["optimizer"] in ("adamw-8bit", "lion")
    if needs_bnb and not _has("bitsandbytes"):
        raise ProbeInputError(
            "setup.method" if setup["method"] == "qlora" else "setup.optimizer",
            "needs bitsandbytes installed (pip install bitsandbytes)",
        )
    if setup["optimizer"] == "adamw-4bit" and not _has("torchao"):
        raise ProbeInputError(
            "setup.optimizer", "adamw-4bit needs torchao installed (pip install torchao)"
        )
    if setup["method"] == "qlora" and device == "fake":
        raise ProbeInputError(
            "setup.method",
            "qlora cannot be traced with fake tensors: bitsandbytes quantises real weights "
            "while transformers loads them; run it on cpu or cuda",
        )
    if setup["loss"] == "chunked" and not _has("trl"):
        raise ProbeInputError(
            "setup.loss",
            "loss=chunked on the hf stack runs TRL's SFTTrainer (its fused LM head); install "
            "trl (the probe extra), or use --loss full for transformers' own loss",
        )
    if setup["loss"] == "chunked" and setup["loss_chunk"] != TRL_TOKEN_TILE:
        raise ProbeInputError(
            "setup.loss_chunk",
            f"TRL's fused LM head tiles {TRL_TOKEN_TILE} positions at a time "
            "(trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE) and has no setting for it",
        )
    if setup["loss"] == "liger" and (device != "cuda" or not _has("liger_kernel")):
        raise ProbeInputError(
            "setup.loss",
            "loss=liger (TrainingArguments use_liger_kernel=True) needs liger-kernel and triton "
            f"on a CUDA GPU (device is {device})",
        )
    if setup["checkpointing"] == "offload":
        raise ProbeInputError(
            "setup.checkpointing",
            "transformers' Trainer has no offloaded checkpointing (gradient_checkpointing keeps "
            "the layer inputs on the device; Unsloth's offloaded variant needs CUDA). Use "
            "--stack probe for the probe's offloaded checkpointing",
        )
    if setup["optimizer_impl"] == "in-backward":
        raise ProbeInputError(
            "setup.optimizer_impl",
            "in-backward optimizer steps are a torchtune/torchtitan feature, not a Trainer option",
        )
    if setup["paged"] and device != "cuda":
        raise ProbeInputError(
            "setup.paged", "paged optimizers use CUDA unified memory: they need a CUDA device"
        )
    if setup["sharding"] != "none" or setup["num_gpus"] > 1:
        raise ProbeInputError("setup.sharding", "the hf stack probe runs one device")


def _check_evaluation(setup: dict[str, Any], device: str) -> None:
    """An evaluation pass is measured through transformers' `Trainer.evaluate()` (the hf stack),
    on one CUDA device or the CPU (fake tensors would need the step modes around it)."""
    if setup["stack"] != "hf":
        raise ProbeInputError(
            "setup.eval_batch", "an evaluation pass is measured with --stack hf (Trainer.evaluate)"
        )
    if device == "fake" or setup["num_gpus"] > 1:
        raise ProbeInputError(
            "setup.eval_batch", "an evaluation pass is measured on one cuda device or the cpu"
        )


def _check_objective(setup: dict[str, Any], device: str) -> None:
    """A preference objective is measured through the installed TRL's own trainer
    (probe.trl_stack): DPO's DPOTrainer with TRL's fused head (`--loss chunked`, TRL 1.10 on) or
    TRL 1.0-1.9's full logits (`--loss full`), reference log-probabilities computed each step (a
    full fine-tune's reference model is built from the config as the policy is,
    probe.hf_stack.build_hf_reference); ORPOTrainer and CPOTrainer (`cpo`; `simpo` with
    cpo_alpha 0) from the full logits of TRL 1.0-1.9 (`--loss full`; from TRL 1.10
    `selective_log_softmax` runs a Triton kernel on CUDA, trl 1.16.0 trainer/utils.py:572-574,
    which is not modelled); KTOTrainer likewise, on real tensors (the cpu or cuda). The hf
    stack, no evaluation pass."""
    objective = setup["objective"]
    if objective == "sft":
        return
    if objective not in PREFERENCE_TRAINERS:
        raise ProbeInputError(
            "setup.objective",
            f"{objective} is not measured (the probe runs sft, {', '.join(PREFERENCE_TRAINERS)})",
        )
    trainer = PREFERENCE_TRAINERS[objective]
    if setup["stack"] != "hf":
        raise ProbeInputError("setup.stack", f"{objective} runs TRL's {trainer}: --stack hf")
    from probe.trl_stack import fused_head_available, trl_version

    if trl_version() is None:
        raise ProbeInputError("setup.objective", f"{objective} runs TRL's {trainer}: install trl")
    fused = fused_head_available()
    if objective != "dpo" and fused:
        raise ProbeInputError(
            "setup.objective",
            f"{objective} is measured with TRL 1.0-1.9's {trainer} (the full logits through "
            f"selective_log_softmax's autograd path); the installed trl {trl_version()} runs "
            "a Triton kernel there on CUDA (put TRL 1.8.0 first on PYTHONPATH: .trl-1.8, "
            "scripts/setup.sh)",
        )
    loss = "chunked" if fused else "full"
    if setup["loss"] != loss:
        raise ProbeInputError(
            "setup.loss",
            f"{objective} runs the installed TRL's {trainer} (trl {trl_version()}), which "
            f"computes the log-probabilities with --loss {loss} (the fused LM head from TRL "
            "1.10, the full logits up to TRL 1.9)",
        )
    if setup["eval_batch"] is not None:
        raise ProbeInputError(
            "setup.eval_batch", f"no evaluation pass is measured under {objective}"
        )
    if objective == "kto" and device == "fake":
        raise ProbeInputError(
            "setup.objective",
            "kto is measured on the cpu or a cuda device: KTOTrainer splits each batch by its "
            "labels (torch.nonzero, trl v1.8.0 kto_trainer.py:1508-1514), which the fake "
            "trace reads as every row",
        )
    if objective == "kto" and setup["batch"] < 2:
        raise ProbeInputError(
            "setup.batch", "KTOTrainer needs micro-batches of at least 2 rows (kto_trainer.py:785)"
        )


def check_stack(setup: dict[str, Any], device: str) -> None:
    """Raise `ProbeInputError` when `setup.stack` cannot run `setup` on `device` here."""
    stack = setup["stack"]
    _check_objective(setup, device)
    if setup.get("eval_batch") is not None:
        _check_evaluation(setup, device)
    if stack in NOT_RUNNABLE:
        raise ProbeInputError("setup.stack", f"{stack} is not runnable here: {NOT_RUNNABLE[stack]}")
    if setup["checkpointing"] == "selective" and stack != "torchtitan":
        raise ProbeInputError(
            "setup.checkpointing",
            "selective (per-op) checkpointing is torchtitan's: --stack torchtitan",
        )
    if stack == "torchtitan":
        from probe.torchtitan_stack import check_torchtitan_setup

        check_torchtitan_setup(setup, device)
    if stack == "probe":
        _check_probe_stack(setup)
    elif stack == "hf":
        _check_hf_stack(setup, device)
    elif stack == "torchtune":
        from probe.torchtune_stack import check_torchtune_setup

        check_torchtune_setup(setup, device)
