"""The memory test: build the model, run training steps per sequence length, record the peaks.

One training step, as HF Trainer does it: random token ids (batch x seq), forward with labels (or
the chunked loss), take the loss, drop the model output, backward, `optimizer.step()`,
`zero_grad(set_to_none=True)`. One optimizer lives through the whole sweep, so from the second
step on its states are allocated, as in a real run.

Counters per device:
- `cuda`: `torch.cuda.max_memory_allocated` / `max_memory_reserved` after
  `reset_peak_memory_stats` at the start of each length;
- `cpu`: real tensors, counted by `StorageTracker` (512-byte blocks, like the caching allocator);
- `fake`: the same tracker under `FakeTensorMode`: shapes and dtypes only, no memory, so lengths
  that need hundreds of GiB can be traced on a laptop. Timings of fake steps are trace times.

The sweep stops at the first OOM (`torch.OutOfMemoryError`, or the tracker's `memory_cap`) or
error; the remaining lengths are recorded as `skipped`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import torch

from memtest_schema import DEVICES, SCHEMA_ID, validate_memtest
from probe import __version__
from probe.config import check_config, text_config
from probe.cuda_kernels import SUBSTITUTED as CUDA_KERNELS_SUBSTITUTED
from probe.cuda_kernels import CudaKernels
from probe.environment import describe_environment, package_version
from probe.hf_stack import HFSession, build_hf_model, build_hf_reference
from probe.linear_attention import install_linear_attention
from probe.loss import chunked_loss, full_loss
from probe.model import BuiltModel, UnsupportedSetup, build_model
from probe.optim import make_training_optimizer, optimizer_state_tensors
from probe.options import ProbeInputError, normalize_setup, parse_sweep
from probe.results import cuda_free_bytes, device_memory, record_measurement, tokens_per_second
from probe.results import is_oom as _is_oom
from probe.results import new_result as _result
from probe.stacks import check_stack
from probe.torchtune_stack import TorchtuneSession
from probe.tracker import StorageTracker

__all__ = ["run_probe", "default_out_name"]

MAX_STEPS = 100_000

_T = TypeVar("_T")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x"


def default_out_name(doc: dict[str, Any]) -> str:
    """`memtest_<model>_<gpu or device>_<date>.json`."""
    env = doc["environment"]
    gpu = env["gpu_name"] or env["device"]
    if env["gpu_count"] > 1:
        gpu = f"{env['gpu_count']}x{gpu}"
    date = doc["created_at"][:10]
    return f"memtest_{_slug(doc['model']['name'])}_{_slug(gpu)}_{date}.json"


def _model_name(config: dict[str, Any]) -> str:
    name = config.get("_name_or_path")
    if isinstance(name, str) and name:
        return name
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        return arch[0]
    return str(config["model_type"])


@contextlib.contextmanager
def _unpacked_sequences() -> Iterator[None]:
    """Tell transformers the batch is never packed.

    On fake tensors transformers cannot prove that position ids are not packed and then builds a
    (batch, 1, s, s) mask, an artefact of fake mode. The probe's inputs are never packed, so
    `find_packed_sequence_indices` returns None everywhere (the answer it gives real inputs).
    """
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


class _Session:
    """One model, one optimizer, a sweep of lengths on one device."""

    def __init__(
        self,
        built: BuiltModel,
        setup: dict[str, Any],
        device: str,
        vocab: int,
        tracker: StorageTracker | None,
    ) -> None:
        self.built = built
        self.setup = setup
        self.device = device
        self.vocab = vocab
        self.tracker = tracker
        self.torch_device = torch.device("cuda" if device == "cuda" else "cpu")
        params: list[torch.Tensor] = [p for p in built.model.parameters() if p.requires_grad]
        self.optimizer = make_training_optimizer(setup, params, device)
        self.autocast = False  # mixed = bf16 compute with fp32 masters (probe.optim.MasterWeights)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if not self.autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.torch_device.type, dtype=torch.bfloat16)

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self, seq: int) -> dict[str, dict[str, int]] | None:
        """One optimizer step; returns the components at this step's peak and each kind's
        maximum (tracker only)."""
        batch = self.setup["batch"]
        ids = torch.randint(0, self.vocab, (batch, seq), device=self.torch_device)
        with self._autocast():
            if self.setup["loss"] == "chunked":
                loss = chunked_loss(
                    self.built.decoder, self.built.lm_head, ids, self.setup["loss_chunk"]
                )
            else:
                loss = full_loss(self.built.model, ids)
        loss.backward()  # type: ignore[no-untyped-call]
        del loss, ids
        if self.tracker is not None:
            self.tracker.mark_optimizer_step()
        self.optimizer.step()
        components = None
        if self.tracker is not None:
            model = self.built.model
            params = list(model.parameters()) + list(model.buffers())
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            states = optimizer_state_tensors(self.optimizer)
            components = {
                "components": self.tracker.components_at_peak(params, grads, states),
                "maxima": self.tracker.component_maxima(params, grads, states),
            }
        self.optimizer.zero_grad(set_to_none=True)
        return components

    def _free(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def run_length(self, seq: int, steps: int, bar: Any) -> dict[str, Any]:
        """All steps of one length; an OOM is returned as status `oom` (never raised)."""
        res = _result(seq, self.setup["batch"], "ok")
        self._free()
        free_before = (0, 0)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            free_before = cuda_free_bytes()
        if self.tracker is not None:
            self.tracker.reset_peak()
        best: tuple[int, dict[str, dict[str, int]] | None] = (-1, None)
        failure: tuple[str, str] | None = None
        try:
            for _ in range(steps):
                if self.tracker is not None:
                    self.tracker.begin_window()
                self._sync()
                start = time.perf_counter()
                comps = self.step(seq)
                self._sync()
                res["step_seconds"].append(round(time.perf_counter() - start, 6))
                res["steps"] += 1
                if self.tracker is not None and self.tracker.window_peak > best[0]:
                    best = (self.tracker.window_peak, comps)
                if bar is not None:
                    bar.update(1)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
            failure = ("oom" if _is_oom(exc) else "error", f"{type(exc).__name__}: {exc}")
        # the exception (and its traceback holding the step's tensors) is released here
        record_measurement(res, self.device, self.tracker, best[1])
        if self.device == "cuda":
            res["device_memory"] = device_memory(free_before)
        if failure is not None:
            self._free()
            res["status"], res["error"] = failure
            if res["status"] == "error":
                res["peak_allocated_bytes"] = res["peak_allocated_bytes"] or None
        else:
            self._throughput(res, seq)
        return res

    def _throughput(self, res: dict[str, Any], seq: int) -> None:
        if self.device != "fake":
            res["tokens_per_second"] = tokens_per_second(
                res["step_seconds"], self.setup["batch"] * seq
            )


def _attention_kernel(setup: dict[str, Any], kernels: set[str], device: str) -> str:
    if setup["attention"] == "eager":
        return "eager (matmul + softmax, s x s scores kept)"
    if kernels:
        return ", ".join(sorted(kernels))
    if device == "cuda":
        return "sdpa (backend chosen by torch at run time)"
    return "none observed"


def _observes_kernels(session: object, device: str, attention: str) -> bool:
    """Whether the run observes its attention kernels (`_observe_cuda_kernels`): on CUDA with
    a non-eager attention, for the probe's and the hf stack's sessions. Not the torchtune
    stack's: its session has no autocast context and its model is built by torchtune's own
    recipe, not a `decoder` to run one forward of."""
    return device == "cuda" and attention != "eager" and not isinstance(session, TorchtuneSession)


def _observe_cuda_kernels(session: _Session | HFSession) -> set[str]:
    """Which attention ops run on CUDA: one short forward under an op-name observer."""
    from probe.tracker import OutputTensorsMode, attention_kernel

    seen: set[str] = set()

    class _Observer(OutputTensorsMode):  # type: ignore[no-untyped-call]
        """Runs each op; keeps the attention kernels (`attention_kernel`), tracks nothing."""

        def _seen_op(self, func: Any) -> None:
            kernel = attention_kernel(func)
            if kernel is not None:
                seen.add(kernel)

        def _track(self, tensor: torch.Tensor) -> None:
            pass

    ids = torch.randint(0, session.vocab, (1, 256), device="cuda")
    with torch.no_grad(), session._autocast(), _Observer():  # type: ignore[no-untyped-call]
        session.built.decoder(input_ids=ids, use_cache=False)
    return seen


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="step", desc="probe")


def _check_args(steps: int, device: str, memory_cap: int | None) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ProbeInputError(
            "steps", f"must be an integer between 1 and {MAX_STEPS}, got {steps!r}"
        )
    if device not in DEVICES:
        raise ProbeInputError("device", f"must be one of {', '.join(DEVICES)}; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeInputError("device", "cuda was asked for, but torch sees no CUDA device")
    if memory_cap is not None:
        if isinstance(memory_cap, bool) or not isinstance(memory_cap, int) or memory_cap < 1:
            raise ProbeInputError(
                "memory_cap", f"must be a positive number of bytes, got {memory_cap!r}"
            )
        if device == "cuda":
            raise ProbeInputError("memory_cap", "only for the cpu and fake devices (the tracker)")


class _BuildOOM(RuntimeError):
    """The weights alone do not fit on the device."""


def _build(config: dict[str, Any], setup: dict[str, Any], device: str) -> BuiltModel:
    return _build_with(build_model, config, setup, device)


def _build_with(builder: Callable[..., _T], *args: Any) -> _T:
    try:
        return builder(*args)
    except (UnsupportedSetup, ProbeInputError):
        raise
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for bad configs
        if _is_oom(exc):
            raise _BuildOOM(f"{type(exc).__name__} while building the model: {exc}") from None
        raise ProbeInputError(
            "config", f"the model could not be built from this config: {type(exc).__name__}: {exc}"
        ) from None


def _stack_environment(stack: str, device: str, notes: list[str]) -> dict[str, Any]:
    """`environment.stack/libraries/ran/substituted` (the hf stack adds to ran/substituted
    while it builds and trains); `notes` is shared with the memtest's notes."""
    from probe.hf_stack import HF_LIBRARIES
    from probe.torchtune_stack import TORCHTUNE_LIBRARIES

    names = TORCHTUNE_LIBRARIES if stack == "torchtune" else HF_LIBRARIES
    libraries = {name: package_version(name) for name in names}
    ran: list[str] = []
    substituted: list[str] = []
    if stack == "probe":
        ran.append(
            "the probe's own training loop (probe.runner): no autocast, foreach AdamW (fused if "
            "optimizer_impl says so; set explicitly, as on CUDA, also for CPU tensors), its own "
            "fp32 masters stepped per tensor for mixed-precision full fine-tuning, LoRA dropout "
            "0, no gradient accumulation"
        )
    if device == "fake":
        substituted.append(
            "fake tensors (FakeTensorMode): shapes and dtypes only; the CPU kernels' saved "
            "tensors (SDPA flash_attention_for_cpu) stand in for the CUDA kernels'"
        )
    elif device == "cpu":
        substituted.append(
            "CPU tensors counted by the storage tracker (512-byte blocks) stand in for the CUDA "
            "caching allocator's max_memory_allocated; CPU kernels stand in for CUDA's"
        )
    return {
        "stack": stack,
        "libraries": libraries,
        "ran": ran,
        "substituted": substituted,
        "notes": notes,
    }


def _retie(model: Any) -> None:
    """Tie input and output embeddings again where the config ties them (GPT-2): `to_empty`
    materialises each parameter separately, so the tie of the meta model is lost."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    text = (
        config.get_text_config()
        if config is not None and hasattr(config, "get_text_config")
        else config
    )
    if getattr(text, "tie_word_embeddings", False) and hasattr(base, "tie_weights"):
        base.tie_weights()


def run_probe(
    config: dict[str, Any],
    setup: dict[str, Any] | None,
    sweep: list[int] | str,
    steps: int = 3,
    device: str = "cpu",
    memory_cap: int | None = None,
    *,
    name: str | None = None,
    command: str | None = None,
    progress: bool = False,
    time_limit: float | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the memory test and return the memtest document (validated).

    `log`, when given, receives one line per phase (built, each length started and ended) with
    the seconds since the start: where a run's time went when it is killed from outside.

    `time_limit` (seconds): no new length is started once the run has taken longer (those are
    recorded as `skipped`), so a GPU job with a hard deadline still writes its results.
    `on_result` is called with the memtest so far after each length (the CLI writes it, so a
    run killed from outside leaves a valid file).
    Raises `ProbeInputError` for bad input; failures while running are recorded per length.
    """
    started = time.monotonic()

    def phase(text: str) -> None:
        if log is not None:
            log(f"[{time.monotonic() - started:7.1f} s] {text}")

    if time_limit is not None and not time_limit > 0:
        raise ProbeInputError(
            "time_limit", f"must be a positive number of seconds, got {time_limit!r}"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = check_config(config)
    setup = normalize_setup(setup)
    lengths = parse_sweep(sweep)
    _check_args(steps, device, memory_cap)
    from probe.distributed import DistributedRun

    dist = DistributedRun.from_env(device)
    if dist.world_size > 1:
        setup = {**setup, "sharding": "fsdp", "num_gpus": dist.world_size}
    check_stack(setup, device)
    env = describe_environment(device, gpu_count=dist.world_size)
    notes: list[str] = []
    stack_env = _stack_environment(setup["stack"], device, notes)
    env.update({k: stack_env[k] for k in ("stack", "libraries", "ran", "substituted")})
    text = text_config(config)
    vocab = int(text.get("vocab_size") or 0)
    results: list[dict[str, Any]] = []
    built: BuiltModel | None = None
    kernels: set[str] = set()
    ranks: list[dict[str, Any]] | None = None

    def make_doc(done: list[dict[str, Any]]) -> dict[str, Any]:
        """The memtest for the results so far; lengths not reached yet are `skipped`."""
        reached = {r["seq_len"] for r in done}
        pending = [
            _result(s, setup["batch"], "skipped", "not reached (partial memtest, run in progress)")
            for s in lengths
            if s not in reached
        ]
        env["attention_kernel"] = _attention_kernel(setup, kernels, device)
        total = built.params_total if built is not None else 0
        trainable = built.params_trainable if built is not None else 0
        doc: dict[str, Any] = {
            "schema": SCHEMA_ID,
            "created_at": _now(),
            "tool": {
                "name": "trainfit-probe",
                "version": __version__,
                "command": command
                or f"probe.run_probe(device={device!r}, sweep={lengths}, steps={steps})",
            },
            "environment": env,
            "model": {
                "name": name or _model_name(config),
                "model_type": str(config["model_type"]),
                "config": config,
                "params_total": int(total),
                "params_trainable": int(trainable),
            },
            "setup": setup,
            "sweep": lengths,
            "results": [*done, *pending],
        }
        if ranks is not None:
            doc["ranks"] = ranks
        if notes:
            doc["notes"] = list(notes)
        return validate_memtest(doc)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_unpacked_sequences())
        env["linear_attention_kernel"] = stack.enter_context(
            install_linear_attention(config, device)
        )
        if dist.world_size > 1:
            stack.enter_context(dist)
        cuda_kernels = stack.enter_context(CudaKernels()) if device != "cuda" else None
        tracker: StorageTracker | None = None
        reference: Any = None  # DPO's reference model under full fine-tuning (hf stack)
        bar = _progress(len(lengths) * steps, progress)
        stack.callback(lambda: bar.close() if bar is not None else None)
        try:
            # built outside the fake mode and the tracker: on meta for `fake` (peft cannot wrap
            # fake tensors), on the device otherwise; the tracker adopts the weights below
            if setup["stack"] == "torchtune":
                # the recipe builds, loads and trains its own model, one recipe per length
                tt_session = _build_with(
                    TorchtuneSession, config, setup, device, vocab, memory_cap, stack_env
                )
                built, tracker = tt_session.built, tt_session.tracker
            elif setup["stack"] == "hf":
                built = _build_with(build_hf_model, config, setup, device, stack_env)
                if setup["objective"] in ("dpo", "kto") and setup["method"] == "full":
                    reference = _build_with(build_hf_reference, config, setup, device)
            else:
                built = _build(config, setup, device)
                notes.extend(built.notes)
            step_modes: list[Any] = []
            if setup["stack"] == "torchtune":
                pass  # its session enters the tracker inside the recipe's steps
            elif device == "fake":
                from torch._subclasses.fake_tensor import FakeTensorMode

                step_modes.append(stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True)))
            if device in ("cpu", "fake") and setup["stack"] != "torchtune":
                tracker = stack.enter_context(StorageTracker(cap=memory_cap, vocab=vocab))
                step_modes.append(tracker)
            if device == "fake" and setup["stack"] != "torchtune":
                for model in (built.model, reference):
                    if model is not None:
                        model.to_empty(device="cpu")
                        _retie(model)  # to_empty gives tied weights separate storages
                if setup["stack"] == "probe":
                    notes.append(
                        "fake: weights are fake CPU tensors; attention traced with the CPU SDPA "
                        "kernels"
                    )
            if dist.world_size > 1:
                dist.shard(built)
            if tracker is not None and setup["stack"] != "torchtune":
                for model in (built.model, reference):
                    if model is not None:
                        tracker.adopt(list(model.parameters()) + list(model.buffers()))
            session: _Session | HFSession | TorchtuneSession
            if setup["stack"] == "torchtune":
                session = tt_session
            elif setup["stack"] == "hf":
                modes = step_modes or None  # the tracker (and fake mode): inside steps only
                session = HFSession(
                    built, setup, device, vocab, tracker, stack_env, modes, reference
                )
            else:
                session = _Session(built, setup, device, vocab, tracker)
        except (UnsupportedSetup, _BuildOOM, torch.OutOfMemoryError) as exc:
            status = "error" if isinstance(exc, UnsupportedSetup) else "oom"
            results = [_result(lengths[0], setup["batch"], status, str(exc))]
            results += [
                _result(s, setup["batch"], "skipped", f"not run: {status} before the first step")
                for s in lengths[1:]
            ]
        else:
            phase(f"built the model ({setup['stack']} stack, {device})")
            if _observes_kernels(session, device, setup["attention"]):
                assert not isinstance(session, TorchtuneSession)  # (for the type checker)
                kernels |= _observe_cuda_kernels(session)
                phase("observed the attention kernels")
            stopped: str | None = None
            for seq in lengths:
                out_of_time = time_limit is not None and time.monotonic() - started > time_limit
                if stopped is None and out_of_time:
                    stopped = f"not run: the time limit of {time_limit:g} s was reached"
                if stopped is not None:
                    results.append(_result(seq, setup["batch"], "skipped", stopped))
                    continue
                phase(f"seq_len {seq}: started")
                res = session.run_length(seq, steps, bar)
                phase(f"seq_len {seq}: {res['status']}, steps {res['step_seconds']} s")
                results.append(res)
                substituted = stack_env["substituted"]
                used = cuda_kernels is not None and cuda_kernels.substitutions > 0
                if used and CUDA_KERNELS_SUBSTITUTED not in substituted:
                    substituted.append(CUDA_KERNELS_SUBSTITUTED)
                if on_result is not None and tracker is not None:
                    kernels |= tracker.kernels
                if on_result is not None and dist.rank == 0:
                    on_result(make_doc(results))
                if res["status"] != "ok":
                    stopped = f"not run: the sweep stopped at {res['status']} (seq_len {seq})"
            if tracker is not None:
                kernels |= tracker.kernels
            if dist.world_size > 1:
                ranks = dist.gather_ranks(results)

    return make_doc(results)
