"""The `hf` stack: training steps run by transformers' own `Trainer`, as a user writes them.

The model comes from the config (`AutoModelForCausalLM.from_config`, random weights), LoRA from
peft's `get_peft_model(LoraConfig(..., lora_dropout=...))`, QLoRA from `BitsAndBytesConfig` +
`prepare_model_for_kbit_training`; the steps from `Trainer(model, TrainingArguments(...),
train_dataset=random token ids).train()` with `optim`, `bf16`, `gradient_accumulation_steps`,
`gradient_checkpointing` and `gradient_checkpointing_kwargs` set from the setup. The probe adds
no training logic: `MemoryCallback` (a `TrainerCallback`) only reads the storage tracker or the
CUDA counters at the step boundaries the Trainer announces.

Precision as users write it: `mixed` full fine-tuning loads fp32 weights and trains under bf16
autocast (torch AMP: the fp32 weights are the masters); `bf16` loads bf16 weights; LoRA/QLoRA
load a bf16 base (QLoRA: NF4 Linear layers) with fp32 adapters (peft's default).

What cannot be the real thing on this machine is said in `environment.substituted`; what ran as
users run it in `environment.ran`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from probe.environment import package_version
from probe.model import BuiltModel, count_params, default_attention
from probe.optim import optimizer_state_tensors
from probe.results import (
    cuda_free_bytes,
    device_memory,
    finish_result,
    is_oom,
    new_result,
    record_measurement,
)
from probe.tracker import StorageTracker

__all__ = ["build_hf_model", "HFSession", "hf_optim", "hf_weight_dtype", "HF_LIBRARIES"]

HF_LIBRARIES = ("transformers", "peft", "accelerate", "bitsandbytes", "trl", "liger-kernel")
LR = 1e-5


def hf_weight_dtype(setup: dict[str, Any]) -> torch.dtype:
    """The dtype the user loads the weights in (see the module docstring)."""
    if setup["precision"] == "fp32":
        return torch.float32
    if setup["method"] == "full" and setup["precision"] == "mixed":
        return torch.float32  # AMP: fp32 weights (masters), bf16 compute under autocast
    return torch.bfloat16


def hf_optim(setup: dict[str, Any]) -> tuple[str, str]:
    """(`TrainingArguments.optim`, `optim_args`) for the setup's optimizer.

    Names from transformers' `OptimizerNames` (training_args.py): adamw_torch_fused /
    adamw_torch, adamw_bnb_8bit / paged_adamw_8bit, adamw_torch_4bit (torchao), sgd, adafactor,
    lion_32bit (bitsandbytes).
    """
    name, impl = setup["optimizer"], setup["optimizer_impl"]
    if name == "adamw":
        return ("adamw_torch_fused" if impl == "fused" else "adamw_torch"), ""
    if name == "adamw-8bit":
        return ("paged_adamw_8bit" if setup["paged"] else "adamw_bnb_8bit"), ""
    if name == "adamw-4bit":
        return "adamw_torch_4bit", ""  # torchao's AdamW4bit (trainer_optimizer.py:459-465)
    if name == "sgd":
        return "sgd", ""
    if name == "sgd-momentum":
        return "sgd", "momentum=0.9"
    if name == "adafactor":
        return "adafactor", ""
    return ("paged_lion_32bit" if setup["paged"] else "lion_32bit"), ""


def _from_config(
    config: dict[str, Any], setup: dict[str, Any], device: str, notes: list[str]
) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    text = cfg.get_text_config() if "text_config" in config else cfg
    if text is not cfg:
        notes.append(f"built the text decoder ({type(text).__name__}) of a multimodal config")
    text.use_cache = False
    attn = default_attention(text, "eager" if setup["attention"] == "eager" else "sdpa", notes)
    target = torch.device("meta") if device == "fake" else torch.device(device)
    with target:
        return AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            text, dtype=hf_weight_dtype(setup), attn_implementation=attn
        )


def _scratch_dir(size: int) -> str | None:
    """/dev/shm (memory) when it holds `size` bytes with a quarter to spare, else the default
    temporary folder: writing and reading back an 8B model's 16 GB on disk took longer than a
    GPU check's sweep is given."""
    shm = "/dev/shm"
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    return shm if stats.f_bavail * stats.f_frsize > size * 1.25 else None


def _qlora_model(
    config: dict[str, Any], setup: dict[str, Any], device: str, env: dict[str, Any]
) -> Any:
    """transformers quantises while loading a checkpoint: save the random bf16 model to a
    temporary folder, load it back with `BitsAndBytesConfig`, then peft's kbit preparation."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    bnb = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=setup["double_quant"],
    )
    random_model = _from_config(config, {**setup, "method": "lora"}, device, env["notes"])
    size = sum(t.numel() * t.element_size() for t in random_model.state_dict().values())
    with tempfile.TemporaryDirectory(prefix="trainfit-probe-", dir=_scratch_dir(size)) as folder:
        random_model.save_pretrained(folder)
        del random_model
        if device == "cuda":
            torch.cuda.empty_cache()  # the bf16 original must not count against the NF4 run
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=bnb, dtype=torch.bfloat16, device_map=device
        )
    model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
        model,
        use_gradient_checkpointing=setup["checkpointing"] != "none",
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    env["substituted"].append(
        "QLoRA base: random bf16 weights saved to a temporary folder and loaded with "
        "BitsAndBytesConfig (transformers quantises only while loading a checkpoint)"
    )
    where = "CUDA" if device == "cuda" else "the CPU (dequantise + matmul path)"
    env["ran"].append(
        f"bitsandbytes {package_version('bitsandbytes')} NF4 Linear4bit on {where}, "
        f"double_quant={setup['double_quant']}; peft prepare_model_for_kbit_training"
    )
    return model


def _lora(model: nn.Module, setup: dict[str, Any], env: dict[str, Any]) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    from probe.model import peft_target_modules

    targets = setup["lora_targets"]
    target = peft_target_modules(targets)
    alpha = setup["lora_alpha"] if setup["lora_alpha"] is not None else float(setup["lora_rank"])
    lcfg = LoraConfig(
        r=setup["lora_rank"],
        # peft annotates lora_alpha as int; it is a float scale (alpha / r) and takes one
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=setup["lora_dropout"],
        target_modules=target,
        task_type="CAUSAL_LM",
    )
    env["ran"].append(
        f"peft {package_version('peft')} get_peft_model(LoraConfig(r={setup['lora_rank']}, "
        f"lora_alpha={alpha:g}, lora_dropout={setup['lora_dropout']:g}, target_modules={target!r}))"
    )
    try:
        return get_peft_model(model, lcfg, autocast_adapter_dtype=setup["adapter_dtype"] == "fp32")
    except ValueError as exc:
        from probe.model import UnsupportedSetup

        raise UnsupportedSetup(f"lora_targets {targets}: {exc}") from None


def build_hf_model(
    config: dict[str, Any], setup: dict[str, Any], device: str, env: dict[str, Any]
) -> BuiltModel:
    """The model as a user builds it for `Trainer` (on meta for `fake`; the caller
    materialises it inside the fake mode). `env` collects `ran`, `substituted` and `notes`."""
    env["substituted"].append("random weights from the config (from_config), not a checkpoint")
    if setup["method"] == "qlora":
        causal_lm = _qlora_model(config, setup, device, env)
    else:
        causal_lm = _from_config(config, setup, device, env["notes"])
    causal_lm.train()
    model: nn.Module = causal_lm
    if setup["method"] == "full":
        for p in causal_lm.parameters():
            p.requires_grad_(True)
    else:
        model = _lora(causal_lm, setup, env)
    total, trainable = count_params(model)
    return BuiltModel(
        model=model,
        decoder=causal_lm.get_decoder(),
        lm_head=causal_lm.get_output_embeddings(),
        params_total=total,
        params_trainable=trainable,
        library="transformers",
        notes=env["notes"],
    )


def build_hf_reference(config: dict[str, Any], setup: dict[str, Any], device: str) -> Any:
    """DPO's reference model under full fine-tuning, as DPOTrainer loads it: the same config
    in the policy's dtype (trl 1.16.0 dpo_trainer.py:916-927, `create_model_from_path` with
    `dtype=self.model.dtype`; here from the config with random weights, nothing downloaded),
    in eval mode as `from_pretrained` returns it; on meta for `fake`, as the policy."""
    reference = _from_config(config, setup, device, [])
    reference.eval()
    return reference


class _RandomTokens(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """An endless stream of random token rows (labels = input ids, as a causal-LM dataset)."""

    def __init__(self, vocab: int, seq: int, seed: int = 0) -> None:
        self.vocab, self.seq, self.seed = vocab, seq, seed

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        gen = torch.Generator().manual_seed(self.seed)
        while True:
            ids = torch.randint(0, self.vocab, (self.seq,), generator=gen)
            yield {"input_ids": ids, "labels": ids.clone()}


class _EvalTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """`rows` random token rows: one evaluation step of `rows` per device."""

    def __init__(self, vocab: int, seq: int, rows: int, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (rows, seq), generator=gen)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def _callback_class() -> type:
    from transformers import TrainerCallback

    class MemoryCallback(TrainerCallback):
        """Records memory at the step boundaries the Trainer announces; changes nothing."""

        def __init__(self, session: HFSession, res: dict[str, Any], bar: Any) -> None:
            self.session, self.res, self.bar = session, res, bar
            self.started = 0.0
            self.best: tuple[int, dict[str, Any] | None] = (-1, None)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.session.prepare_optimizer(kw.get("optimizer"))

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.session.step_modes is not None:
                self.session.step_modes.resume()
            tracker = self.session.tracker
            if tracker is not None:
                tracker.begin_window()
            self.session.sync()
            self.started = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.session.tracker is not None:
                self.session.tracker.mark_optimizer_step()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tracker = self.session.tracker
            if tracker is None:
                return
            model, optimizer = kw["model"], kw["optimizer"]
            params = list(model.parameters()) + list(model.buffers())
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            states = optimizer_state_tensors(optimizer)
            if tracker.window_peak > self.best[0]:
                comps = {
                    "components": tracker.components_at_peak(params, grads, states),
                    "maxima": tracker.component_maxima(params, grads, states),
                }
                self.best = (tracker.window_peak, comps)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.session.step_modes is not None:
                self.session.step_modes.pause()
            self.session.sync()
            self.res["step_seconds"].append(round(time.perf_counter() - self.started, 6))
            self.res["steps"] += 1
            if self.bar is not None:
                self.bar.update(1)

    return MemoryCallback


def arguments_class(base: type, fake: bool) -> type:
    """`base` (`TrainingArguments`, or a TRL config, its subclass), or under fake tensors a
    subclass whose documented `place_model_on_device` hook says False: the model is already
    materialised on the fake CPU, and `Module.to` would try to swap fake parameters that the
    fake mode holds weak references to."""
    if not fake:
        return base

    class FakeTensorArguments(base):  # type: ignore[misc]
        @property
        def place_model_on_device(self) -> bool:
            return False

    return FakeTensorArguments


@contextlib.contextmanager
def _noop_moves_keep_fake_params() -> Iterator[None]:
    """Let `Module.to(device)` keep a fake parameter that is already there.

    Trainer and accelerate call `model.to(args.device)`; for fake tensors torch's `_apply` takes
    the `swap_tensors` path, which refuses tensors the fake mode holds weak references to, even
    when nothing changes. Within this context a swap between two fake tensors of the same
    device, dtype, shape and strides is skipped (the parameter is kept, as a no-op move keeps it
    on real tensors); every other swap runs unchanged."""
    from torch._subclasses.fake_tensor import FakeTensor

    original: Callable[[torch.Tensor, torch.Tensor], None] = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        same = (
            isinstance(t1, FakeTensor)
            and isinstance(t2, FakeTensor)
            and (t1.device, t1.dtype, t1.shape, t1.stride())
            == (t2.device, t2.dtype, t2.shape, t2.stride())
        )
        if not same:
            original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


class _StepModes:
    """Dispatch modes (fake mode, tracker) that are active only inside Trainer steps.

    Under fake tensors the Trainer's own bookkeeping cannot run: the DataLoader draws its seed
    with `.item()`, and the end of `train()` reads the loss with `.item()`, data-dependent calls
    a fake tensor cannot answer. So the caller's modes are paused for `train()` and the callback
    re-enters them from `on_step_begin` (the micro-batches are already loaded, real tensors that
    the fake mode converts) to `on_step_end` (after the optimizer step and `zero_grad`): forward,
    backward, clipping and the optimizer step all run fake and tracked. Nothing is changed in
    what the Trainer does. On the CPU the tracker alone is paused the same way, so CPU and fake
    runs count the same storages (the DataLoader's token batches in neither)."""

    def __init__(self, modes: list[Any]) -> None:
        self.modes = modes  # outermost first
        self.active = True  # entered by the caller

    def pause(self) -> None:
        if self.active:
            for mode in reversed(self.modes):
                mode.__exit__(None, None, None)
            self.active = False

    def resume(self) -> None:
        if not self.active:
            for mode in self.modes:
                mode.__enter__()
            self.active = True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()


class HFSession:
    """One model, a `Trainer` per sequence length (`max_steps` = the probe's steps)."""

    def __init__(
        self,
        built: BuiltModel,
        setup: dict[str, Any],
        device: str,
        vocab: int,
        tracker: StorageTracker | None,
        env: dict[str, Any],
        step_modes: list[Any] | None = None,
        reference: Any = None,
    ) -> None:
        self.built, self.setup, self.device, self.vocab = built, setup, device, vocab
        self.tracker, self.env = tracker, env
        self.reference = reference  # DPO's reference model (full fine-tuning), or None
        # fake: the fake mode and the tracker, active only from on_step_begin to on_step_end
        # (see `_StepModes`); None: the caller keeps its modes active throughout
        # TRL's SFTTrainer, or its preference trainer whatever the loss (probe/trl_stack.py)
        self.trl = setup["loss"] == "chunked" or setup["objective"] != "sft"
        self.fused_head = setup["loss"] == "chunked"  # TRL's fused LM head runs
        if self.trl and device == "fake" and step_modes:
            from probe.trl_stack import enter_all_rows_valid

            # inside the caller's modes, which are active
            step_modes = [*step_modes, enter_all_rows_valid()]
        self.step_modes = _StepModes(step_modes) if step_modes else None
        self.torch_device = torch.device("cuda" if device == "cuda" else "cpu")
        self._folder = tempfile.TemporaryDirectory(prefix="trainfit-probe-trainer-")
        self._describe()

    def _describe(self) -> None:
        optim, optim_args = hf_optim(self.setup)
        s = self.setup
        extra = f", optim_args={optim_args!r}" if optim_args else ""
        from probe.stacks import PREFERENCE_TRAINERS

        trainer_class = PREFERENCE_TRAINERS.get(s["objective"], "SFTTrainer")
        trl_trainer = trainer_class.removesuffix("Trainer")
        trainer = (
            f"TRL {package_version('trl')} {trl_trainer}Trainer.train() with {trl_trainer}Config("
            if self.trl
            else f"transformers {package_version('transformers')} Trainer.train() with "
            "TrainingArguments("
        )
        self.env["ran"].insert(
            0,
            f"{trainer}optim={optim!r}{extra}, "
            f"bf16={s['autocast']}, per_device_train_batch_size={s['batch']}, "
            f"gradient_accumulation_steps={s['grad_accum']}, "
            f"gradient_checkpointing={s['checkpointing'] == 'gpu'}"
            + (
                ", gradient_checkpointing_kwargs={'use_reentrant': False}"
                if s["checkpointing"] == "gpu"
                else ""
            )
            + ")",
        )
        if self.reference is not None:
            self.env["substituted"].append(
                "DPO's reference model: built from the config with random weights in the "
                "policy's dtype and passed as ref_model (DPOTrainer loads it by the config's "
                "name, trl 1.16.0 dpo_trainer.py:916-927)"
            )
        if self.device == "cuda":
            return
        if self.trl:
            from probe.trl_stack import FAKE_SUBSTITUTED, SUBSTITUTED

            if self.fused_head:
                self.env["substituted"].append(SUBSTITUTED)
            if self.device == "fake":
                self.env["substituted"].append(FAKE_SUBSTITUTED)
        if s["autocast"]:
            self.env["substituted"].append(
                "bf16 autocast runs with the CPU's autocast op lists (torch.amp), which stand "
                "in for CUDA's: they agree on the matmuls and SDPA (bf16), but CUDA's also runs "
                "layer_norm, pow, exp, log, rsqrt, sum and softmax without a dtype in fp32 "
                "(aten/src/ATen/autocast_mode.cpp, the AutocastCUDA fp32 lists), so a model "
                "applying those to bf16 tensors (GPT-2's LayerNorms and gelu_new) makes fp32 "
                "tensors on CUDA where this run makes bf16 ones"
            )
        if s["optimizer"] == "adamw" and s["optimizer_impl"] == "foreach":
            self.env["substituted"].append(
                "optimizer_impl=foreach: torch AdamW on CPU tensors defaults to its per-tensor "
                "loop (foreach is the default for CUDA tensors only); the probe sets the param "
                "groups' foreach=True so CUDA's default path and its temporaries run"
            )
        if s["optimizer"] == "adamw" and s["optimizer_impl"] == "fused":
            how = "its meta kernel, traced" if self.device == "fake" else "the CPU kernel"
            self.env["ran"].append(f"torch fused AdamW (_fused_adamw_, {how})")
        if s["optimizer"] in ("adamw-8bit", "lion"):
            self.env["ran"].append(
                f"bitsandbytes {package_version('bitsandbytes')} 8-bit/32-bit optimizer on the CPU"
            )

    def prepare_optimizer(self, optimizer: Any) -> None:
        """The one substitution on the optimizer: CUDA's default foreach path forced on CPU
        tensors (see `_describe`)."""
        if optimizer is None or self.device == "cuda":
            return
        if self.setup["optimizer"] == "adamw" and self.setup["optimizer_impl"] == "foreach":
            for group in optimizer.param_groups:
                group["foreach"] = True

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self.setup["autocast"]:
            return contextlib.nullcontext()
        return torch.autocast(self.torch_device.type, dtype=torch.bfloat16)

    def _arguments(self, steps: int) -> Any:
        from transformers import TrainingArguments

        fake = self.device == "fake"
        return arguments_class(TrainingArguments, fake)(**self._argument_values(steps))

    def _argument_values(self, steps: int) -> dict[str, Any]:
        s = self.setup
        optim, optim_args = hf_optim(s)
        ckpt = s["checkpointing"] == "gpu"
        return dict(
            output_dir=self._folder.name,
            max_steps=steps,
            per_device_train_batch_size=s["batch"],
            per_device_eval_batch_size=s["eval_batch"] or s["batch"],
            prediction_loss_only=True,
            gradient_accumulation_steps=s["grad_accum"],
            learning_rate=LR,
            optim=optim,
            optim_args=optim_args or None,
            bf16=s["autocast"],
            gradient_checkpointing=ckpt,
            gradient_checkpointing_kwargs={"use_reentrant": False} if ckpt else None,
            use_liger_kernel=s["loss"] == "liger",
            use_cpu=self.device != "cuda",
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            eval_strategy="no",
            logging_nan_inf_filter=self.device != "fake",
            dataloader_num_workers=0,
            remove_unused_columns=False,
            disable_tqdm=True,
            seed=0,
        )

    def run_length(self, seq: int, steps: int, bar: Any) -> dict[str, Any]:
        """`Trainer.train()` for `steps` optimizer steps at this length; OOM -> status `oom`."""
        res = new_result(seq, self.setup["batch"], "ok")
        free_before = (0, 0)
        if self.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            free_before = cuda_free_bytes()
        if self.tracker is not None:
            self.tracker.reset_peak()
        callback = _callback_class()(self, res, bar)
        with contextlib.ExitStack() as stack:
            if self.step_modes is not None:
                stack.enter_context(self.step_modes.paused())
            if self.device == "fake":
                stack.enter_context(_noop_moves_keep_fake_params())
            failure, trainer = self._train(seq, steps, callback)
        record_measurement(res, self.device, self.tracker, callback.best[1])
        if self.device == "cuda":
            res["device_memory"] = device_memory(free_before)
        if self.setup["eval_batch"] and failure is None and trainer is not None:
            res["evaluation"] = self._evaluate(trainer, seq)
        del trainer
        tokens = self.setup["batch"] * self.setup["grad_accum"] * seq
        return finish_result(res, failure, self.device, tokens)

    def _train(self, seq: int, steps: int, callback: Any) -> tuple[tuple[str, str] | None, Any]:
        """One `Trainer(...).train()`: ((status, error) on failure else None, the trainer,
        whose optimizer keeps its states for an evaluation)."""
        from transformers import PrinterCallback, Trainer

        trainer = None
        try:
            with self._trl_paths():
                if self.trl:
                    trainer = self._trl_trainer(seq, steps, callback)
                else:
                    trainer = Trainer(
                        model=self.built.model,
                        args=self._arguments(steps),
                        train_dataset=_RandomTokens(self.vocab, seq),
                        callbacks=[callback],
                    )
                trainer.remove_callback(PrinterCallback)  # no per-run metrics on stdout
                trainer.train()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
            return ("oom" if is_oom(exc) else "error", f"{type(exc).__name__}: {exc}"), None
        finally:
            if self.step_modes is not None:
                self.step_modes.pause()  # a step that raised left the modes entered
        return None, trainer

    def _trl_trainer(self, seq: int, steps: int, callback: Any) -> Any:
        """TRL's DPOTrainer under `objective: dpo` (the loss the installed TRL runs,
        probe/stacks.py), its ORPOTrainer under `orpo`, its CPOTrainer under `cpo` and
        `simpo`, else its SFTTrainer (probe/trl_stack.py `dpo_trainer`, `orpo_trainer`,
        `sft_trainer`), on the rows `steps` optimizer steps take."""
        from probe import trl_stack

        rows = steps * self.setup["batch"] * self.setup["grad_accum"]
        values = self._argument_values(steps)
        fake = self.device == "fake"
        if self.setup["objective"] == "dpo":
            return trl_stack.dpo_trainer(
                self.built.model, values, fake, self.vocab, seq, rows, callback, self.reference
            )
        if self.setup["objective"] == "kto":
            return trl_stack.kto_trainer(
                self.built.model, values, fake, self.vocab, seq, rows, callback, self.reference
            )
        if self.setup["objective"] != "sft":
            return trl_stack.orpo_trainer(
                self.built.model,
                values,
                fake,
                self.vocab,
                seq,
                rows,
                callback,
                self.setup["objective"],
            )
        return trl_stack.sft_trainer(
            self.built.model, values, fake, self.vocab, seq, rows, callback
        )

    def _trl_paths(self) -> contextlib.ExitStack:
        """TRL's CUDA paths off CUDA, and under fake tensors its masks read as a real run's
        (probe/trl_stack.py); nothing for transformers' own Trainer or on CUDA."""
        stack = contextlib.ExitStack()
        if self.trl and self.device != "cuda":
            from probe.trl_stack import cuda_paths, fake_masks_read_as_real

            if self.fused_head:
                stack.enter_context(cuda_paths())
            if self.device == "fake":
                stack.enter_context(fake_masks_read_as_real())
        return stack

    def _evaluate(self, trainer: Any, seq: int) -> dict[str, Any]:
        """`trainer.evaluate()` on `eval_batch` rows of `seq` tokens after the training steps,
        as the Trainer evaluates between steps (the optimizer's states resident, the gradients
        zeroed): its own peak, counters reset before it. `use_cache` off for it, as TRL's
        compute_loss, axolotl and LLaMA-Factory set it for training runs."""
        rows = int(self.setup["eval_batch"])
        out: dict[str, Any] = {"rows": rows, "status": "ok", "error": None}
        out.update(peak_allocated_bytes=None, peak_reserved_bytes=None)
        config = getattr(self.built.model, "config", None)
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = False
        self.sync()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if self.tracker is not None:
            self.tracker.reset_peak()
        try:
            with self._trl_paths():
                trainer.evaluate(eval_dataset=_EvalTokens(self.vocab, seq, rows))
        except Exception as exc:  # noqa: BLE001 - a failure is recorded, not raised
            out["status"] = "oom" if is_oom(exc) else "error"
            out["error"] = f"{type(exc).__name__}: {exc}"
        self.sync()
        if self.device == "cuda":
            out["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            out["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        elif self.tracker is not None:
            out["peak_allocated_bytes"] = int(self.tracker.peak)
        return out
