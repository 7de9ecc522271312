"""The `torchtune` stack: training steps run by torchtune's own single-device recipes.

`LoRAFinetuneRecipeSingleDevice` (recipes/lora_finetune_single_device.py, LoRA, and QLoRA with
`lora_llama3_2(quantize_base=True)`: torchao NF4Tensor base weights) and
`FullFinetuneRecipeSingleDevice` (recipes/full_finetune_single_device.py, full fine-tuning) of
the installed torchtune release run as `tune run` runs them: `recipe = Recipe(cfg)`,
`recipe.setup(cfg)`, `recipe.train()`, `recipe.cleanup()`, with an OmegaConf config written as a
user writes one (the llama3_2 `*_single_device.yaml` configs: model builder, llama3 tokenizer,
`FullModelHFCheckpointer`, an alpaca-format dataset, `torch.optim.AdamW`, `CEWithChunkedOutputLoss`,
`batch_size`, `gradient_accumulation_steps`, `enable_activation_checkpointing`,
`optimizer_in_bwd`, `compile: False`, `dtype`).

Everything the recipe reads is made locally, per length, in a temporary folder: the model is
torchtune's `llama3_2` / `lora_llama3_2` component builder with the sizes of the user's HF
`config.json`; the checkpoint is that builder's random initialisation converted with torchtune's
own `tune_to_hf` and saved as `model.safetensors` next to the config (what
`FullModelHFCheckpointer` reads); the tokenizer is a byte-level tiktoken BPE file (256 byte
tokens, no merges) with llama3's special tokens numbered from 256 (`special_tokens_path`); the
dataset is a local alpaca-format JSON file whose texts are longer than the length, so
`max_seq_len` truncation gives every sample exactly `seq` tokens.

The probe adds no training logic. What it adds is torchtune's own extension points and hooks
that only read: the config's `metric_logger` is `MemoryMetricLogger` (the recipe calls
`log_dict` once per optimizer step, after `optimizer.step()`, `zero_grad` and the scheduler), a
forward pre-hook on the model opens the measurement window on a step's first micro-batch, and
optimizer step hooks (`register_step_pre_hook` / `register_step_post_hook`) mark the optimizer
step and classify the storages while the gradients are alive. The storage tracker is active
only inside that window, as for the hf stack: checkpoint loading, the DataLoader's token batches
and the recipe's end-of-epoch `save_checkpoint` are not counted.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import importlib.util
import json
import random
import string
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from probe.environment import package_version
from probe.model import BuiltModel, count_params
from probe.optim import optimizer_state_tensors
from probe.options import ProbeInputError
from probe.results import (
    cuda_free_bytes,
    device_memory,
    finish_result,
    is_oom,
    new_result,
    record_measurement,
)
from probe.tracker import StorageTracker

__all__ = [
    "TORCHTUNE_LIBRARIES",
    "TorchtuneSession",
    "MemoryMetricLogger",
    "FakeCheckpointer",
    "check_torchtune_setup",
    "builder_args",
    "recipe_config",
]

TORCHTUNE_LIBRARIES = (
    "torchtune",
    "torchao",
    "torchdata",
    "omegaconf",
    "tiktoken",
    "safetensors",
    "datasets",
    "bitsandbytes",
)
RECIPES = {
    "lora": "lora_finetune_single_device",
    "qlora": "lora_finetune_single_device",  # lora_llama3_2(quantize_base=True)
    "full": "full_finetune_single_device",
}
RECIPE_CLASSES = {
    "lora": "LoRAFinetuneRecipeSingleDevice",
    "qlora": "LoRAFinetuneRecipeSingleDevice",
    "full": "FullFinetuneRecipeSingleDevice",
}
ATTN_TARGETS = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
MLP_TARGETS = {"gate_proj", "up_proj", "down_proj"}
# llama3's special tokens the tokenizer needs (torchtune models/llama3/_tokenizer.py:82-103)
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
LR = 3e-4


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_torchtune_setup(setup: dict[str, Any], device: str) -> None:
    """Raise `ProbeInputError` (naming the field) for what torchtune's recipes cannot run."""
    if not _has("torchtune") or not _has("omegaconf"):
        raise ProbeInputError(
            "setup.stack",
            "the torchtune stack needs torchtune installed (pip install 'trainfit[torchtune]': "
            "torchtune 0.6.1 with torchao 0.11)",
        )
    if setup["method"] == "qlora" and setup["precision"] != "bf16":
        raise ProbeInputError(
            "setup.precision", "torchtune's QLoRA (torchao NF4) runs with dtype bf16"
        )
    if setup["precision"] == "mixed":
        raise ProbeInputError(
            "setup.precision",
            "torchtune has no mixed precision: its recipes train in `dtype` (bf16 or fp32) "
            "with no autocast and no fp32 masters; use --precision bf16 or fp32",
        )
    if setup["autocast"]:
        raise ProbeInputError("setup.autocast", "torchtune's recipes have no autocast")
    if setup["method"] != "full":
        want = "bf16" if setup["precision"] == "bf16" else "fp32"
        if setup["adapter_dtype"] != want:
            raise ProbeInputError(
                "setup.adapter_dtype",
                f"torchtune's LoRA adapters are in the model's dtype ({want}): "
                "recipes/lora_finetune_single_device.py validate_expected_param_dtype",
            )
    if setup["loss"] == "liger":
        raise ProbeInputError("setup.loss", "torchtune has no liger loss; use full or chunked")
    if setup["attention"] != "sdpa":
        raise ProbeInputError(
            "setup.attention", "torchtune's attention calls SDPA (torchtune/modules/attention.py)"
        )
    if setup["checkpointing"] == "offload" and device != "cuda":
        raise ProbeInputError(
            "setup.checkpointing",
            "enable_activation_offloading needs CUDA (the recipe raises on other devices)",
        )
    impl = setup["optimizer_impl"]
    if impl == "in-backward":
        if setup["method"] != "full":
            raise ProbeInputError(
                "setup.optimizer_impl",
                "optimizer_in_bwd is an option of the full fine-tuning recipe only",
            )
        if setup["grad_accum"] != 1:
            raise ProbeInputError(
                "setup.grad_accum", "optimizer_in_bwd needs gradient_accumulation_steps=1"
            )
    if setup["optimizer"] not in ("adamw", "adamw-8bit", "sgd", "sgd-momentum"):
        raise ProbeInputError(
            "setup.optimizer", "the torchtune probe runs adamw, adamw-8bit, sgd or sgd-momentum"
        )
    if setup["optimizer"] == "adamw-8bit" and not _has("bitsandbytes"):
        raise ProbeInputError("setup.optimizer", "adamw-8bit needs bitsandbytes installed")
    if setup["paged"] and device != "cuda":
        raise ProbeInputError(
            "setup.paged", "paged optimizers use CUDA unified memory: they need a CUDA device"
        )
    if setup["sharding"] != "none" or setup["num_gpus"] > 1:
        raise ProbeInputError(
            "setup.sharding", "the torchtune probe runs the single-device recipes"
        )


def builder_args(config: dict[str, Any]) -> dict[str, Any]:
    """torchtune `llama3_2` builder arguments for a Llama-style HF `config.json`."""
    if config.get("model_type") not in ("llama", "mistral", "qwen2"):
        raise ProbeInputError(
            "config.model_type",
            f"the torchtune probe builds Llama-style decoders; got {config.get('model_type')!r}",
        )
    if config.get("model_type") == "qwen2" or config.get("attention_bias"):
        raise ProbeInputError(
            "config.attention_bias", "torchtune's llama3_2 builder has no attention biases"
        )
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = config.get("head_dim")
    if head_dim is not None and int(head_dim) * heads != hidden:
        raise ProbeInputError(
            "config.head_dim",
            "torchtune's llama3_2 builder uses head_dim = hidden_size / num_attention_heads",
        )
    vocab = int(config["vocab_size"])
    if vocab < MIN_VOCAB:
        raise ProbeInputError(
            "config.vocab_size",
            f"the probe's byte-level tokenizer needs vocab_size >= {MIN_VOCAB}, got {vocab}",
        )
    return {
        "vocab_size": vocab,
        "num_layers": int(config["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": int(config.get("num_key_value_heads") or heads),
        "embed_dim": hidden,
        "intermediate_dim": int(config["intermediate_size"]),
        "norm_eps": float(config.get("rms_norm_eps", 1e-5)),
        "rope_base": int(config.get("rope_theta", 500_000)),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
    }


def lora_targets(targets: list[str]) -> tuple[list[str], bool]:
    """(`lora_attn_modules`, `apply_lora_to_mlp`) for the setup's HF module names."""
    if targets == ["all-linear"]:
        return ["q_proj", "k_proj", "v_proj", "output_proj"], True
    unknown = [t for t in targets if t not in ATTN_TARGETS and t not in MLP_TARGETS]
    if unknown:
        raise ProbeInputError(
            "setup.lora_targets", f"torchtune's LoRA builders have no module {unknown[0]!r}"
        )
    mlp = {t for t in targets if t in MLP_TARGETS}
    if mlp and mlp != MLP_TARGETS:
        raise ProbeInputError(
            "setup.lora_targets",
            "torchtune's apply_lora_to_mlp adapts gate, up and down projections together",
        )
    return [ATTN_TARGETS[t] for t in targets if t in ATTN_TARGETS], bool(mlp)


def _model_cfg(config: dict[str, Any], setup: dict[str, Any], seq: int) -> dict[str, Any]:
    """The `model` section. `max_seq_len` is the config's `max_position_embeddings`, as in
    torchtune's named builders (llama3_2_1b: 131072): the RoPE cache is built for it at model
    build (models/llama3_1/_position_embeddings.py:86-99, a non-persistent fp32 buffer)."""
    longest = max(seq, int(config.get("max_position_embeddings") or seq))
    args = {**builder_args(config), "max_seq_len": longest}
    if setup["method"] == "full":
        return {"_component_": "torchtune.models.llama3_2.llama3_2", **args}
    attn, mlp = lora_targets(setup["lora_targets"])
    alpha = setup["lora_alpha"] if setup["lora_alpha"] is not None else float(setup["lora_rank"])
    return {
        "_component_": "torchtune.models.llama3_2.lora_llama3_2",
        "quantize_base": setup["method"] == "qlora",
        "lora_attn_modules": attn,
        "apply_lora_to_mlp": mlp,
        "apply_lora_to_output": False,
        **args,
        "lora_rank": setup["lora_rank"],
        "lora_alpha": alpha,
        "lora_dropout": setup["lora_dropout"],
    }


def _optimizer_cfg(setup: dict[str, Any]) -> dict[str, Any]:
    name, impl = setup["optimizer"], setup["optimizer_impl"]
    if name == "adamw":
        out: dict[str, Any] = {"_component_": "torch.optim.AdamW", "weight_decay": 0.01, "lr": LR}
        # in-backward: one AdamW per parameter; CUDA's default (foreach) path, set explicitly
        out["fused" if impl == "fused" else "foreach"] = True
        return out
    if name == "adamw-8bit":
        component = "PagedAdamW8bit" if setup["paged"] else "AdamW8bit"
        return {"_component_": f"bitsandbytes.optim.{component}", "lr": LR}
    momentum = 0.9 if name == "sgd-momentum" else 0.0
    return {"_component_": "torch.optim.SGD", "lr": LR, "momentum": momentum}


def recipe_config(
    config: dict[str, Any], setup: dict[str, Any], seq: int, steps: int, device: str, folder: str
) -> dict[str, Any]:
    """The recipe's config as a user writes it (the llama3_2 single-device yamls), as a dict."""
    loss = (
        "torchtune.modules.loss.CEWithChunkedOutputLoss"
        if setup["loss"] == "chunked"
        else "torch.nn.CrossEntropyLoss"
    )
    cfg: dict[str, Any] = {
        "output_dir": f"{folder}/output",
        "model": _model_cfg(config, setup, seq),
        "tokenizer": {
            "_component_": "torchtune.models.llama3.llama3_tokenizer",
            "path": f"{folder}/tokenizer.model",
            "special_tokens_path": f"{folder}/special_tokens.json",
            "max_seq_len": seq,
        },
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": f"{folder}/checkpoint",
            "checkpoint_files": ["model.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": "${output_dir}",
            "model_type": "LLAMA3_2",
        }
        if device != "fake"
        else {
            "_component_": "probe.torchtune_stack.FakeCheckpointer",
            "model_type": "LLAMA3_2",
            "builder": builder_args(config),
            "dtype": setup["precision"],
        },
        "resume_from_checkpoint": False,
        "dataset": {
            "_component_": "torchtune.datasets.alpaca_dataset",
            "source": "json",
            "data_files": f"{folder}/data.json",
            "split": "train",
            "packed": False,
        },
        "seed": 0,
        "shuffle": False,
        "batch_size": setup["batch"],
        "optimizer": _optimizer_cfg(setup),
        "loss": {"_component_": loss},
        "epochs": 1,
        "max_steps_per_epoch": steps,
        "gradient_accumulation_steps": setup["grad_accum"],
        "clip_grad_norm": None,
        "compile": False,
        "metric_logger": {"_component_": "probe.torchtune_stack.MemoryMetricLogger"},
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "device": "cuda" if device == "cuda" else "cpu",
        "dtype": setup["precision"],
        "enable_activation_checkpointing": setup["checkpointing"] != "none",
        "enable_activation_offloading": setup["checkpointing"] == "offload",
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }
    if setup["loss"] == "full":
        cfg["loss"]["ignore_index"] = -100
    if setup["method"] != "full":
        cfg["save_adapter_weights_only"] = False
        cfg["lr_scheduler"] = {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": 100,
        }
    else:
        cfg["optimizer_in_bwd"] = setup["optimizer_impl"] == "in-backward"
    return cfg


# -- local files the recipe reads ----------------------------------------------------------


def _write_tokenizer(folder: Path) -> None:
    """A byte-level tiktoken BPE file (each byte its own token, no merges) and llama3's special
    tokens numbered from 256, in the `added_tokens` form of a HF tokenizer.json."""
    lines = [f"{base64.b64encode(bytes([i])).decode()} {i}" for i in range(256)]
    (folder / "tokenizer.model").write_text("\n".join(lines) + "\n", encoding="utf-8")
    added = [{"id": 256 + i, "content": t} for i, t in enumerate(SPECIAL_TOKENS)]
    (folder / "special_tokens.json").write_text(json.dumps({"added_tokens": added}))


def _write_dataset(folder: Path, seq: int, samples: int) -> None:
    """Alpaca-format rows whose output text is longer than `seq` bytes (one token per byte)."""
    rng = random.Random(0)
    rows = []
    for _ in range(samples):
        words = []
        size = 0
        while size < seq + 64:
            word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
            words.append(word)
            size += len(word) + 1
        rows.append({"instruction": "Continue.", "input": "", "output": " ".join(words)})
    (folder / "data.json").write_text(json.dumps(rows))


def _write_checkpoint(folder: Path, config: dict[str, Any], setup: dict[str, Any]) -> None:
    """The `llama3_2` builder's random initialisation in the model's dtype, converted to HF
    names by torchtune's `tune_to_hf` and saved as model.safetensors beside the config."""
    from safetensors.torch import save_file
    from torchtune.models import convert_weights
    from torchtune.models.llama3_2 import llama3_2

    args = builder_args(config)
    dtype = torch.bfloat16 if setup["precision"] == "bf16" else torch.float32
    torch.manual_seed(0)
    with _default_dtype(dtype):
        model = llama3_2(**args, max_seq_len=8)
    state = {k: v for k, v in model.state_dict().items() if "rope" not in k}
    hf = convert_weights.tune_to_hf(
        state,
        num_heads=args["num_heads"],
        num_kv_heads=args["num_kv_heads"],
        dim=args["embed_dim"],
    )
    if args["tie_word_embeddings"]:
        hf.pop("lm_head.weight", None)
    ckpt = folder / "checkpoint"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in hf.items()}, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps(config))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Any:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class FakeCheckpointer:
    """Fake mode's checkpointer (`checkpointer._component_`): `load_checkpoint` returns the
    `llama3_2` builder's initialisation made under the active FakeTensorMode (shapes only; a
    70B checkpoint file cannot be written here, and FullModelHFCheckpointer reads real
    safetensors); `save_checkpoint` saves nothing (safetensors cannot write fake tensors)."""

    def __init__(self, builder: dict[str, Any], dtype: str, **kwargs: Any) -> None:
        self.builder, self.dtype = dict(builder), dtype

    def load_checkpoint(self) -> dict[str, Any]:
        from torchtune import training
        from torchtune.models.llama3_2 import llama3_2

        dtype = torch.bfloat16 if self.dtype == "bf16" else torch.float32
        with _default_dtype(dtype):
            model = llama3_2(**self.builder, max_seq_len=8)
        state = {k: v for k, v in model.state_dict().items() if "rope" not in k}
        return {training.MODEL_KEY: state}

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


@contextlib.contextmanager
def _fake_mode() -> Any:
    """FakeTensorMode whose `.item()` answers an unbacked symbol (a ShapeEnv): the recipe
    reads `running_loss.item()` after every optimizer step, only to log it. Within it,
    `Llama3ScaledRoPE.apply_scaling` (torchtune models/llama3_1/_position_embeddings.py:103-125,
    a Python loop that branches on each frequency's value) returns the frequencies unscaled:
    the RoPE cache keeps its shape and dtype, which is all a fake trace has."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    original = Llama3ScaledRoPE.apply_scaling

    def unscaled(self: Any, freqs: torch.Tensor, *args: Any) -> torch.Tensor:
        return freqs

    Llama3ScaledRoPE.apply_scaling = unscaled
    try:
        with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()):
            yield
    finally:
        Llama3ScaledRoPE.apply_scaling = original


def _recipe_module(method: str) -> ModuleType:
    """torchtune's recipe file, loaded as `tune run` loads it (runpy on the path): the wheel's
    `recipes` package refuses to be imported (recipes/__init__.py)."""
    spec = importlib.util.find_spec("recipes")
    assert spec is not None and spec.submodule_search_locations is not None
    path = Path(list(spec.submodule_search_locations)[0]) / f"{RECIPES[method]}.py"
    name = f"_trainfit_torchtune_{RECIPES[method]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


# -- the measurement window ----------------------------------------------------------------


def storage_tensors(tensors: Any) -> list[torch.Tensor]:
    """The tensors that own memory: a traceable wrapper subclass (torchao's NF4Tensor, the
    QLoRA base weights) is replaced by its inner tensors (`__tensor_flatten__`: packed 4-bit
    data, int8 scalers, ...); its own storage reports the bf16 size of its shape."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    out: list[torch.Tensor] = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            out.extend(storage_tensors(getattr(t, name) for name in names))
        else:
            out.append(t)
    return out


_RECORDER: list[_StepRecorder] = []  # the recorder of the recipe that is running


class MemoryMetricLogger:
    """A torchtune metric logger (`metric_logger._component_`): the recipe calls `log_dict`
    once per optimizer step, after `optimizer.step()`, `zero_grad` and the scheduler, which
    closes the probe's measurement window. Logs nothing."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def log(self, name: str, data: Any, step: int) -> None:
        pass

    def log_config(self, config: Any) -> None:
        pass

    def log_dict(self, payload: Any, step: int) -> None:
        if _RECORDER:
            _RECORDER[-1].step_end()

    def close(self) -> None:
        pass


class _StepRecorder:
    """Opens the window (tracker entered, `begin_window`) at a step's first forward, marks the
    optimizer step, classifies storages after it, closes the window at `log_dict`."""

    def __init__(
        self, tracker: StorageTracker | None, res: dict[str, Any], bar: Any, device: str
    ) -> None:
        self.tracker, self.res, self.bar, self.device = tracker, res, bar, device
        self.recipe: Any = None
        self.open = False
        self.started = 0.0
        self.best: tuple[int, dict[str, Any] | None] = (-1, None)
        self.classified = False

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def forward_pre_hook(self, module: nn.Module, args: Any) -> None:
        if self.open:
            return  # a later micro-batch of the same optimizer step
        self._sync()
        self.started = time.perf_counter()
        if self.tracker is not None:
            self.tracker.__enter__()
            self.tracker.begin_window()
        self.open = True
        self.classified = False

    def gradient_hook(self, grad: torch.Tensor) -> None:
        if self.tracker is not None and self.open:
            self.tracker.note_gradient(grad)

    def optimizer_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.tracker is not None and self.open:
            self.tracker.mark_optimizer_step()

    def optimizer_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.classify()

    def classify(self) -> None:
        """Components at the window's peak while parameters, gradients and states live."""
        tracker = self.tracker
        if tracker is None or not self.open or self.classified:
            return
        model = self.recipe._model
        params = storage_tensors([*model.parameters(), *model.buffers()])
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        states: list[torch.Tensor] = []
        for opt in self.optimizers():
            states.extend(optimizer_state_tensors(opt))
        if tracker.window_peak > self.best[0]:
            comps = {
                "components": tracker.components_at_peak(params, grads, states),
                "maxima": tracker.component_maxima(params, grads, states),
            }
            self.best = (tracker.window_peak, comps)
        self.classified = True

    def optimizers(self) -> list[Any]:
        wrapper = getattr(self.recipe, "_optim_ckpt_wrapper", None)
        if getattr(self.recipe, "_optimizer_in_bwd", False) and wrapper is not None:
            return list(wrapper.optim_map.values())
        return [self.recipe._optimizer]

    def step_end(self) -> None:
        if not self.open:
            return
        self.classify()  # optimizer in backward: no step hook ran (gradients already freed)
        self.close()
        self._sync()
        self.res["step_seconds"].append(round(time.perf_counter() - self.started, 6))
        self.res["steps"] += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.open and self.tracker is not None:
            self.tracker.__exit__(None, None, None)
        self.open = False

    def attach(self, recipe: Any) -> None:
        self.recipe = recipe
        recipe._model.register_forward_pre_hook(self.forward_pre_hook)
        if getattr(recipe, "_optimizer_in_bwd", False):
            # one optimizer per parameter, stepped inside the backward as each gradient is
            # ready and freed right after (torchtune 0.6.1 training/memory.py:236-242,
            # register_optim_in_bwd_hooks): no separate optimizer step to mark, and the
            # classification at `log_dict` finds no gradient alive, so each gradient is noted
            # as one when autograd hands it to the parameter (a tensor hook, run before
            # AccumulateGrad installs that tensor as `.grad`; it keeps no reference)
            for param in recipe._model.parameters():
                if param.requires_grad:
                    param.register_hook(self.gradient_hook)
            return
        for opt in self.optimizers():
            opt.register_step_pre_hook(self.optimizer_pre_hook)
            opt.register_step_post_hook(self.optimizer_post_hook)


# -- the session ---------------------------------------------------------------------------


def _describe(setup: dict[str, Any], device: str, env: dict[str, Any]) -> None:
    s = setup
    recipe = RECIPE_CLASSES[s["method"]]
    loss = "CEWithChunkedOutputLoss" if s["loss"] == "chunked" else "torch.nn.CrossEntropyLoss"
    optim = _optimizer_cfg(s)["_component_"]
    env["ran"].append(
        f"torchtune {package_version('torchtune')} recipes/{RECIPES[s['method']]}.py "
        f"{recipe}(cfg).setup(cfg) + .train() with dtype={s['precision']}, "
        f"batch_size={s['batch']}, gradient_accumulation_steps={s['grad_accum']}, "
        f"enable_activation_checkpointing={s['checkpointing'] != 'none'}, "
        f"optimizer={optim}"
        + (f" ({s['optimizer_impl']})" if s["optimizer"] == "adamw" else "")
        + (
            f", optimizer_in_bwd={s['optimizer_impl'] == 'in-backward'}"
            if s["method"] == "full"
            else f", lora_rank={s['lora_rank']}, lora_dropout={s['lora_dropout']:g}"
        )
        + f", loss={loss}, compile=False"
        + (
            f", quantize_base=True (torchao {package_version('torchao')} NF4Tensor)"
            if s["method"] == "qlora"
            else ""
        )
    )
    env["ran"].append(
        "torchtune's llama3_2 / lora_llama3_2 builders, FullModelHFCheckpointer (LLAMA3_2), "
        "llama3_tokenizer (tiktoken), alpaca_dataset (source json), StatefulDataLoader"
    )
    if device == "fake":
        env["substituted"].append(
            "checkpointer: probe.torchtune_stack.FakeCheckpointer returns the llama3_2 "
            "builder's initialisation as fake tensors and saves nothing (FullModelHFCheckpointer "
            "reads real safetensors files); running_loss.item() answers an unbacked symbol "
            "(FakeTensorMode with a ShapeEnv), used only for the recipe's log line; "
            "Llama3ScaledRoPE.apply_scaling returns the frequencies unscaled (same shapes)"
        )
    else:
        env["substituted"].append(
            "checkpoint: the llama3_2 builder's random initialisation saved as "
            "model.safetensors (torchtune tune_to_hf) with the user's config.json, not "
            "downloaded weights"
        )
    env["substituted"].append(
        "tokenizer: a byte-level tiktoken BPE file made locally (256 byte tokens, no merges) "
        "with llama3's special tokens numbered from 256; dataset: local alpaca-format JSON "
        "rows longer than the length (max_seq_len truncation gives exactly seq tokens)"
    )
    env["substituted"].append(
        "metric_logger: probe.torchtune_stack.MemoryMetricLogger (logs nothing; closes the "
        "measurement window at each optimizer step's log_dict)"
    )
    if device != "cuda" and s["optimizer"] == "adamw" and s["optimizer_impl"] == "foreach":
        env["substituted"].append(
            "AdamW foreach=True set in the config: on CPU tensors torch defaults to the "
            "per-tensor loop (foreach is CUDA's default)"
        )


def _meta_built(config: dict[str, Any], setup: dict[str, Any], notes: list[str]) -> BuiltModel:
    """Parameter counts from the same builder on the meta device (nothing allocated)."""
    from omegaconf import OmegaConf
    from torchtune import config as tt_config

    cfg = OmegaConf.create({"model": _model_cfg(config, setup, 8)})
    with torch.device("meta"):
        model = tt_config.instantiate(cfg.model)
    if setup["method"] != "full":
        from torchtune.modules.peft import get_adapter_params, set_trainable_params

        set_trainable_params(model, get_adapter_params(model))
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    total, trainable = count_params(model)
    return BuiltModel(
        model=model,
        decoder=model,
        lm_head=model.output if hasattr(model, "output") else model,
        params_total=total,
        params_trainable=trainable,
        library="torchtune",
        notes=notes,
    )


class TorchtuneSession:
    """One recipe per sequence length (the tokenizer's `max_seq_len` and the dataset are per
    length); the storage tracker lives through the sweep and is active inside steps only."""

    def __init__(
        self,
        config: dict[str, Any],
        setup: dict[str, Any],
        device: str,
        vocab: int,
        memory_cap: int | None,
        env: dict[str, Any],
    ) -> None:
        self.config, self.setup, self.device = config, setup, device
        self.env, self.memory_cap, self.vocab = env, memory_cap, vocab
        # the sweep's tracker (the runner reads the attention kernels from it); each length is
        # counted by a tracker of its own, as if its recipe ran in its own process: a recipe
        # with optimizer_in_bwd is not freed when it is done (the per-parameter optimizers
        # hang off gradient hooks of its parameters), and its storages must not count in the
        # next length
        self.tracker = None if device == "cuda" else StorageTracker(cap=memory_cap, vocab=vocab)
        self.built = _meta_built(config, setup, env["notes"])
        _describe(setup, device, env)

    def run_length(self, seq: int, steps: int, bar: Any) -> dict[str, Any]:
        """`recipe.setup(cfg)` + `recipe.train()` for `steps` optimizer steps at this length."""
        from omegaconf import OmegaConf

        res = new_result(seq, self.setup["batch"], "ok")
        tracker = None
        if self.device != "cuda":
            tracker = StorageTracker(cap=self.memory_cap, vocab=self.vocab)
        recorder = _StepRecorder(tracker, res, bar, self.device)
        failure: tuple[str, str] | None = None
        free_before = (0, 0)
        with tempfile.TemporaryDirectory(prefix="trainfit-torchtune-") as name:
            folder = Path(name)
            samples = steps * self.setup["grad_accum"] * self.setup["batch"]
            _write_tokenizer(folder)
            _write_dataset(folder, seq, samples)
            if self.device != "fake":
                _write_checkpoint(folder, self.config, self.setup)
            cfg = OmegaConf.create(
                recipe_config(self.config, self.setup, seq, steps, self.device, name)
            )
            module = _recipe_module(self.setup["method"])
            recipe_class = getattr(module, RECIPE_CLASSES[self.setup["method"]])
            _RECORDER.append(recorder)
            recipe: Any = None
            fake = _fake_mode() if self.device == "fake" else contextlib.nullcontext()
            try:
                with fake:
                    try:
                        recipe = recipe_class(cfg=cfg)
                        recipe.setup(cfg=cfg)
                        free_before = self._start(recipe, recorder)
                        recipe.train()
                        recipe.cleanup()
                    finally:
                        recorder.close()  # a step that raised left the tracker entered
            except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
                failure = ("oom" if is_oom(exc) else "error", f"{type(exc).__name__}: {exc}")
            finally:
                _RECORDER.remove(recorder)
            record_measurement(res, self.device, tracker, recorder.best[1])
            if tracker is not None and self.tracker is not None:
                self.tracker.kernels |= tracker.kernels
            if self.device == "cuda":
                res["device_memory"] = device_memory(free_before)
            if recipe is not None:
                self._count(recipe)
            del recipe
            gc.collect()
        tokens = self.setup["batch"] * self.setup["grad_accum"] * seq
        return finish_result(res, failure, self.device, tokens)

    def _start(self, recipe: Any, recorder: _StepRecorder) -> tuple[int, int]:
        """After `recipe.setup`: hooks attached, the model's weights adopted by the tracker
        (or CUDA's counters reset); returns CUDA's free bytes before the first step."""
        recorder.attach(recipe)
        if self.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return cuda_free_bytes()
        if recorder.tracker is not None:
            model = recipe._model
            recorder.tracker.adopt(storage_tensors([*model.parameters(), *model.buffers()]))
            recorder.tracker.reset_peak()
        return (0, 0)

    def _count(self, recipe: Any) -> None:
        """Parameter counts of the model the recipe trained (replaces the meta count)."""
        model = getattr(recipe, "_model", None)
        if model is not None:
            self.built.params_total, self.built.params_trainable = count_params(model)
