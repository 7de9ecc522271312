"""The memtest document (`trainfit.memtest/1`): what the probe writes and the service stores.

Pure standard library, so the probe (on a bare GPU box), the estimator and the web service can
all import it. Two entry points:

- `load_memtest(data)` parses JSON strictly (no duplicate keys, no NaN/Infinity, an object at the
  top) and validates it;
- `validate_memtest(doc)` checks an already parsed document.

Both raise `MemtestSchemaError` on the first problem, naming the field as a dotted path such as
`results[2].peak_allocated_bytes`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "DuplicatedKey",
    "reject_duplicate_keys",
    "SCHEMA_ID",
    "DEVICES",
    "STATUSES",
    "SETUP_FIELDS",
    "STACK_SETUP_FIELDS",
    "STACKS",
    "COMPONENT_KEYS",
    "MAXIMA_KEYS",
    "DEVICE_MEMORY_KEYS",
    "MAX_BATCH",
    "MAX_RESULTS",
    "MemtestSchemaError",
    "load_memtest",
    "validate_memtest",
]

SCHEMA_ID = "trainfit.memtest/1"
DEVICES = ("cuda", "cpu", "fake")
STATUSES = ("ok", "oom", "error", "skipped")
COMPONENT_KEYS = ("params", "grads", "optimizer", "activations")
# Optional `results[i].component_maxima`: the largest bytes each kind reached during the step
# (each at its own moment, so they do not add up to the peak). `trainable_states` = gradients +
# optimizer states (+ fp32 masters); `activations` = everything else except `logits`, which are
# the storages whose last dimension is the vocabulary (logits, their fp32 copies and gradients).
MAXIMA_KEYS = ("weights", "trainable_states", "activations", "logits")
# Optional among them: `optimizer_step`, the most bytes of temporaries (not weights, states or
# logits) created from the optimizer step's start on (fused/foreach/8-bit step buffers); when it
# is present, `activations` covers only the forward and backward before that point.
OPTIONAL_MAXIMA_KEYS = ("optimizer_step",)
# Optional `results[i].device_memory` (CUDA only): `torch.cuda.mem_get_info()` before the first
# step and after the last step of the length: what nvidia-smi sees (the CUDA context, library
# workspaces and everything the caching allocator reserved), not only torch's tensors.
DEVICE_MEMORY_KEYS = ("total_bytes", "free_before_bytes", "free_after_bytes")

# The estimator's `TrainingSetup` fields with their allowed values (None: not an enumeration).
SETUP_CHOICES: dict[str, tuple[str, ...] | None] = {
    "method": ("full", "lora", "qlora"),
    "lora_rank": None,
    "lora_alpha": None,
    "lora_targets": None,
    "adapter_dtype": ("fp32", "bf16"),
    "optimizer": ("adamw", "adamw-8bit", "adamw-4bit", "sgd", "sgd-momentum", "adafactor", "lion"),
    "precision": ("mixed", "bf16", "fp32"),
    # selective: torchtitan's per-op SelectiveAC (--stack torchtitan only)
    "checkpointing": ("none", "gpu", "offload", "selective"),
    "loss": ("full", "chunked", "liger"),
    "loss_chunk": None,
    "batch": None,
    "sharding": ("none", "fsdp", "zero1", "zero2", "zero3", "device_map"),
    "num_gpus": None,
    "attention": ("sdpa", "flash", "eager"),
}
SETUP_FIELDS = tuple(SETUP_CHOICES)

# Training stacks (issue 10/11). `probe` is the probe's own loop; the others are the libraries
# users train with. A memtest names the one that ran in `setup.stack` and `environment.stack`.
STACKS = ("hf", "unsloth", "torchtune", "torchtitan", "deepspeed", "probe")

# Optional setup fields added with the stacks (absent in memtests written before them, so a
# document without them stays valid): name -> allowed values (None: checked by `_check_setup`).
STACK_SETUP_FIELDS: dict[str, tuple[str, ...] | None] = {
    "stack": STACKS,
    "autocast": None,  # bool: bf16 autocast around forward and loss (HF `bf16=True`)
    "optimizer_impl": ("fused", "foreach", "in-backward"),
    "paged": None,  # bool: bitsandbytes paged optimizer
    "lora_dropout": None,  # number in [0, 1)
    "grad_accum": None,  # int >= 1: micro-batches per optimizer step
    "double_quant": None,  # bool: bnb_4bit_use_double_quant
    "kbit_prepare": None,  # bool: peft's prepare_model_for_kbit_training ran (QLoRA)
    "train_embeddings": None,  # bool: embeddings / lm_head trained (peft modules_to_save)
    "base": ("bf16", "int8", "nf4"),  # storage of the frozen base weights
    "compile": None,  # bool: torch.compile of the decoder layers
    "liger_kernels": None,  # bool: Liger's RMSNorm / SwiGLU / RoPE (use_liger_kernel)
    "quantize_experts": None,  # bool: MoE expert banks in NF4 too (quantize_moe_experts)
    # multi-GPU layout (issue 12, estimator/parallel/): absent for a single-device run
    "parallel": None,  # str or null: `fsdp=8,tp=8`, `zero3`, `dp`, ...
    "fsdp_wrap": None,  # str: FSDP unit, `layer` or `block-of-N` (+embeddings, +lm_head)
    "reshard_after_forward": None,  # bool: FSDP2 reshard_after_forward
    "offload": ("none", "optimizer", "params"),  # ZeRO / FSDP CPU offload
    "pp_schedule": ("1f1b", "interleaved-1f1b", "gpipe"),  # pipeline schedule under pp=N
    "pp_virtual": None,  # int >= 1 or null: interleaved model chunks per rank
    # the estimator's evaluation pass (estimator/memory/evaluation.py); the probe measures
    # training steps only, so a comparison leaves it out
    "eval_batch": None,  # int >= 1 or null: rows per device of an evaluation pass
    "eval_skip_logits": None,  # bool: that pass's Liger loss skips the logits (TRL)
    # the estimator's padded rows (SDPA's (b, 1, s, s) masks); the probe's rows are never padded
    "padded_batches": None,  # bool
    # the training objective (estimator/objective.py): `dpo` runs TRL's DPOTrainer, `batch`
    # counting preference pairs; absent: sft
    "objective": ("sft", "dpo", "dpo-precomputed", "kto", "orpo", "cpo", "simpo"),
}

MAX_RESULTS = 1000
MAX_STEPS = 100_000
MAX_RANKS = 100_000
MAX_BATCH = 1_000_000  # rows per device, the estimator's setup_rules.MAX_BATCH
MAX_STRING = 100_000
MAX_BYTES = 2**63 - 1
MAX_DOCUMENT_BYTES = 64 * 2**20

_ISO_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)$")


class MemtestSchemaError(ValueError):
    """A memtest document that does not follow `trainfit.memtest/1`.

    `field` is the dotted path of the offending value (`""` for the whole document), `message`
    says what is wrong with it.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field or '<document>'}: {message}")


# ---------------------------------------------------------------------------------------------
# parsing


class DuplicatedKey(dict):  # type: ignore[type-arg]
    """An object in which a key occurs twice; `key` names it (the path is found afterwards).
    The service's strict JSON bodies (app/api/strict.py) use the same parse."""

    key: str = ""


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads(..., object_pairs_hook=reject_duplicate_keys)`: an object with a repeated key
    comes back as a `DuplicatedKey` naming it (json.loads itself would keep the last value)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            marked = DuplicatedKey(out)
            marked.key = key
            return marked
        out[key] = value
    return out


def _find_duplicate(value: Any, path: str) -> str | None:
    """The dotted path of the first duplicated key in the parsed document, if any."""
    if isinstance(value, DuplicatedKey):
        return _join(path, value.key)
    if isinstance(value, dict):
        children: Any = value.items()
    elif isinstance(value, list):
        children = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, child in children:
        child_path = f"{path}{key}" if key.startswith("[") else _join(path, key)
        found = _find_duplicate(child, child_path)
        if found:
            return found
    return None


def _reject_constant(name: str) -> float:
    raise MemtestSchemaError("", f"{name} is not valid JSON (use null)")


def load_memtest(data: str | bytes) -> dict[str, Any]:
    """Parse a memtest JSON text strictly and validate it; returns the document."""
    if isinstance(data, bytes | bytearray):
        if len(data) > MAX_DOCUMENT_BYTES:
            raise MemtestSchemaError("", f"document larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemtestSchemaError("", f"not UTF-8: {exc}") from None
    elif isinstance(data, str):
        text = data
        if len(text) > MAX_DOCUMENT_BYTES:
            raise MemtestSchemaError("", f"document larger than {MAX_DOCUMENT_BYTES} bytes")
    else:
        raise MemtestSchemaError("", "expected JSON text (str or bytes)")
    try:
        doc = json.loads(
            text, object_pairs_hook=reject_duplicate_keys, parse_constant=_reject_constant
        )
    except MemtestSchemaError:
        raise
    except json.JSONDecodeError as exc:
        raise MemtestSchemaError(
            "", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise MemtestSchemaError("", "JSON nested too deeply") from None
    duplicate = _find_duplicate(doc, "")
    if duplicate:
        raise MemtestSchemaError(duplicate, "duplicated key")
    if not isinstance(doc, dict):
        raise MemtestSchemaError("", "top level must be a JSON object")
    return validate_memtest(doc)


# ---------------------------------------------------------------------------------------------
# small checkers: each takes (value, path) and raises with the path


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _obj(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MemtestSchemaError(path, f"expected an object, got {_type_name(value)}")
    return value


def _require(doc: dict[str, Any], key: str, path: str) -> Any:
    if key not in doc:
        raise MemtestSchemaError(_join(path, key), "missing")
    return doc[key]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _str(value: object, path: str, *, nullable: bool = False, nonempty: bool = False) -> None:
    if value is None and nullable:
        return
    if not isinstance(value, str):
        kind = "a string or null" if nullable else "a string"
        raise MemtestSchemaError(path, f"expected {kind}, got {_type_name(value)}")
    if len(value) > MAX_STRING:
        raise MemtestSchemaError(path, f"string longer than {MAX_STRING} characters")
    if nonempty and not value.strip():
        raise MemtestSchemaError(path, "must not be empty")


def _int(
    value: object,
    path: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_BYTES,
    nullable: bool = False,
) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or null" if nullable else "an integer"
        raise MemtestSchemaError(path, f"expected {kind}, got {_type_name(value)}")
    if value < minimum:
        raise MemtestSchemaError(path, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise MemtestSchemaError(path, f"must be <= {maximum}, got {value}")


def _float(value: object, path: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a number or null" if nullable else "a number"
        raise MemtestSchemaError(path, f"expected {kind}, got {_type_name(value)}")
    if not math.isfinite(value):
        raise MemtestSchemaError(path, "must be finite")
    if value < 0:
        raise MemtestSchemaError(path, f"must be >= 0, got {value}")


def _choice(value: object, path: str, choices: Iterable[str]) -> None:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise MemtestSchemaError(path, f"must be one of {', '.join(options)}; got {value!r}")


def _fields(
    doc: dict[str, Any], path: str, checks: dict[str, Callable[[Any, str], object]]
) -> None:
    for key, check in checks.items():
        check(_require(doc, key, path), _join(path, key))


# ---------------------------------------------------------------------------------------------
# sections


def _check_tool(value: object, path: str) -> None:
    tool = _obj(value, path)
    _fields(
        tool,
        path,
        {
            "name": lambda v, p: _str(v, p, nonempty=True),
            "version": lambda v, p: _str(v, p, nonempty=True),
            "command": lambda v, p: _str(v, p),
        },
    )


def _check_environment(value: object, path: str) -> None:
    env = _obj(value, path)
    _fields(
        env,
        path,
        {
            "device": lambda v, p: _choice(v, p, DEVICES),
            "gpu_name": lambda v, p: _str(v, p, nullable=True),
            "total_memory_bytes": lambda v, p: _int(v, p, nullable=True),
            "gpu_count": lambda v, p: _int(v, p, minimum=1, maximum=MAX_RANKS),
            "torch": lambda v, p: _str(v, p, nonempty=True),
            "cuda": lambda v, p: _str(v, p, nullable=True),
            "transformers": lambda v, p: _str(v, p, nullable=True),
            "peft": lambda v, p: _str(v, p, nullable=True),
            "bitsandbytes": lambda v, p: _str(v, p, nullable=True),
            "memory_counter": lambda v, p: _str(v, p, nonempty=True),
            "attention_kernel": lambda v, p: _str(v, p, nonempty=True),
            "linear_attention_kernel": lambda v, p: _str(v, p, nullable=True),
        },
    )
    _check_stack_environment(env, path)


def _check_model(value: object, path: str) -> None:
    model = _obj(value, path)
    _fields(
        model,
        path,
        {
            "name": lambda v, p: _str(v, p, nonempty=True),
            "model_type": lambda v, p: _str(v, p, nonempty=True),
            "config": _obj,
            "params_total": lambda v, p: _int(v, p),
            "params_trainable": lambda v, p: _int(v, p),
        },
    )
    if model["params_trainable"] > model["params_total"]:
        raise MemtestSchemaError(_join(path, "params_trainable"), "larger than params_total")


def _check_setup(value: object, path: str) -> None:
    setup = _obj(value, path)
    for key in setup:
        if key not in SETUP_CHOICES and key not in STACK_SETUP_FIELDS:
            raise MemtestSchemaError(_join(path, key), "unknown setup field")
    _check_stack_setup(setup, path)
    for key, choices in SETUP_CHOICES.items():
        item = _require(setup, key, path)
        field = _join(path, key)
        if choices is not None:
            _choice(item, field, choices)
        elif key in ("lora_rank", "loss_chunk", "batch", "num_gpus"):
            _int(item, field, minimum=1)
        elif key == "lora_alpha":
            _float(item, field, nullable=True)
        elif key == "lora_targets":
            if not isinstance(item, list) or not item:
                raise MemtestSchemaError(field, "expected a non-empty list of module names")
            for i, name in enumerate(item):
                _str(name, f"{field}[{i}]", nonempty=True)


def _bool(value: object, path: str) -> None:
    if not isinstance(value, bool):
        raise MemtestSchemaError(path, f"expected true or false, got {_type_name(value)}")


def _check_stack_setup(setup: dict[str, Any], path: str) -> None:
    """The optional stack fields, each checked only when present."""
    for key, choices in STACK_SETUP_FIELDS.items():
        if key not in setup:
            continue
        item, field = setup[key], _join(path, key)
        if choices is not None:
            _choice(item, field, choices)
        elif key in (
            "autocast",
            "paged",
            "double_quant",
            "kbit_prepare",
            "train_embeddings",
            "compile",
            "liger_kernels",
            "quantize_experts",
            "reshard_after_forward",
            "padded_batches",
            "eval_skip_logits",
        ):
            _bool(item, field)
        elif key == "parallel":
            if item is not None:
                _str(item, field, nonempty=True)
        elif key == "fsdp_wrap":
            _str(item, field, nonempty=True)
        elif key == "grad_accum":
            _int(item, field, minimum=1, maximum=MAX_STEPS)
        elif key == "pp_virtual":
            if item is not None:
                _int(item, field, minimum=1, maximum=MAX_RANKS)
        elif key == "eval_batch":
            if item is not None:
                _int(item, field, minimum=1, maximum=MAX_BATCH)
        elif key == "lora_dropout":
            _float(item, field)
            if item >= 1:
                raise MemtestSchemaError(field, f"must be < 1, got {item}")


def _check_str_list(value: object, path: str) -> None:
    if not isinstance(value, list):
        raise MemtestSchemaError(path, f"expected a list, got {_type_name(value)}")
    for i, item in enumerate(value):
        _str(item, f"{path}[{i}]", nonempty=True)


def _check_stack_environment(env: dict[str, Any], path: str) -> None:
    """Optional: which stack ran, its library versions, what ran for real, what was substituted."""
    if "stack" in env:
        _choice(env["stack"], _join(path, "stack"), STACKS)
    if "libraries" in env:
        libs = _obj(env["libraries"], _join(path, "libraries"))
        for name, version in libs.items():
            _str(version, _join(_join(path, "libraries"), name), nullable=True)
    for key in ("ran", "substituted"):
        if key in env:
            _check_str_list(env[key], _join(path, key))


def _check_components(value: object, path: str) -> None:
    if value is None:
        return
    comps = _obj(value, path)
    for key in comps:
        if key not in COMPONENT_KEYS and key != "host":
            raise MemtestSchemaError(_join(path, key), "unknown component")
    for key in COMPONENT_KEYS:
        _int(_require(comps, key, path), _join(path, key))
    if "host" in comps:
        _int(comps["host"], _join(path, "host"))


def _check_evaluation(value: object, path: str) -> None:
    """Optional `results[i].evaluation`: `Trainer.evaluate()` on `rows` rows after the length's
    steps (probe --eval-batch), its own peaks (counters reset before it)."""
    ev = _obj(value, path)
    _fields(
        ev,
        path,
        {
            "rows": lambda v, p: _int(v, p, minimum=1, maximum=MAX_BATCH),
            "status": lambda v, p: _choice(v, p, STATUSES),
            "peak_allocated_bytes": lambda v, p: _int(v, p, nullable=True),
            "peak_reserved_bytes": lambda v, p: _int(v, p, nullable=True),
            "error": lambda v, p: _str(v, p, nullable=True),
        },
    )
    if ev["status"] == "ok" and ev["peak_allocated_bytes"] is None:
        raise MemtestSchemaError(_join(path, "peak_allocated_bytes"), "required when status is ok")


def _check_result(value: object, path: str, max_steps: int) -> None:
    res = _obj(value, path)
    _fields(
        res,
        path,
        {
            "seq_len": lambda v, p: _int(v, p, minimum=1),
            "batch": lambda v, p: _int(v, p, minimum=1),
            "status": lambda v, p: _choice(v, p, STATUSES),
            "steps": lambda v, p: _int(v, p, maximum=max_steps),
            "peak_allocated_bytes": lambda v, p: _int(v, p, nullable=True),
            "peak_reserved_bytes": lambda v, p: _int(v, p, nullable=True),
            "tokens_per_second": lambda v, p: _float(v, p, nullable=True),
            "error": lambda v, p: _str(v, p, nullable=True),
            "components": _check_components,
        },
    )
    seconds = _require(res, "step_seconds", path)
    spath = _join(path, "step_seconds")
    if not isinstance(seconds, list):
        raise MemtestSchemaError(spath, f"expected a list, got {_type_name(seconds)}")
    if len(seconds) > max_steps:
        raise MemtestSchemaError(spath, f"more than {max_steps} entries")
    for i, s in enumerate(seconds):
        _float(s, f"{spath}[{i}]")
    if "host_bytes" in res:
        _int(res["host_bytes"], _join(path, "host_bytes"), nullable=True)
    if "simulated_reserved_bytes" in res:  # cpu/fake: probe/simulated_reserved.py
        key = "simulated_reserved_bytes"
        _int(res[key], _join(path, key), nullable=True)
    if res.get("device_memory") is not None:
        dpath = _join(path, "device_memory")
        dmem = _obj(res["device_memory"], dpath)
        for key in DEVICE_MEMORY_KEYS:
            _int(_require(dmem, key, dpath), _join(dpath, key))
    if res.get("evaluation") is not None:
        _check_evaluation(res["evaluation"], _join(path, "evaluation"))
    if res.get("component_maxima") is not None:
        mpath = _join(path, "component_maxima")
        maxima = _obj(res["component_maxima"], mpath)
        for key in maxima:
            if key not in MAXIMA_KEYS + OPTIONAL_MAXIMA_KEYS:
                raise MemtestSchemaError(_join(mpath, key), "unknown component")
        for key in MAXIMA_KEYS:
            _int(_require(maxima, key, mpath), _join(mpath, key))
        for key in OPTIONAL_MAXIMA_KEYS:
            if key in maxima:
                _int(maxima[key], _join(mpath, key))
    if res["status"] == "ok":
        if res["peak_allocated_bytes"] is None:
            raise MemtestSchemaError(
                _join(path, "peak_allocated_bytes"), "required when status is ok"
            )
        if res["steps"] < 1:
            raise MemtestSchemaError(_join(path, "steps"), "must be >= 1 when status is ok")
    if res["steps"] != len(seconds):
        raise MemtestSchemaError(
            _join(path, "steps"), f"{res['steps']} steps but {len(seconds)} step_seconds"
        )
    if (
        res["peak_reserved_bytes"] is not None
        and res["peak_allocated_bytes"] is not None
        and res["peak_reserved_bytes"] < res["peak_allocated_bytes"]
    ):
        raise MemtestSchemaError(
            _join(path, "peak_reserved_bytes"), "smaller than peak_allocated_bytes"
        )
    if res["status"] in ("oom", "error") and not res["error"]:
        raise MemtestSchemaError(_join(path, "error"), f"required when status is {res['status']}")


def _check_rank(value: object, path: str) -> None:
    rank = _obj(value, path)
    _fields(
        rank,
        path,
        {
            "rank": lambda v, p: _int(v, p, maximum=MAX_RANKS),
            "seq_len": lambda v, p: _int(v, p, minimum=1),
            "peak_allocated_bytes": lambda v, p: _int(v, p, nullable=True),
            "peak_reserved_bytes": lambda v, p: _int(v, p, nullable=True),
        },
    )


def validate_memtest(doc: dict[str, Any]) -> dict[str, Any]:
    """Check a parsed memtest document; returns it unchanged or raises `MemtestSchemaError`."""
    _obj(doc, "")
    schema = _require(doc, "schema", "")
    if schema != SCHEMA_ID:
        raise MemtestSchemaError("schema", f"unsupported schema {schema!r}; expected {SCHEMA_ID!r}")
    created = _require(doc, "created_at", "")
    _str(created, "created_at")
    if not _ISO_UTC.match(created):
        raise MemtestSchemaError(
            "created_at", f"expected ISO-8601 UTC like 2026-01-31T12:00:00Z, got {created!r}"
        )
    _check_tool(_require(doc, "tool", ""), "tool")
    _check_environment(_require(doc, "environment", ""), "environment")
    _check_model(_require(doc, "model", ""), "model")
    _check_setup(_require(doc, "setup", ""), "setup")

    sweep = _require(doc, "sweep", "")
    if not isinstance(sweep, list) or not sweep:
        raise MemtestSchemaError("sweep", "expected a non-empty list of sequence lengths")
    if len(sweep) > MAX_RESULTS:
        raise MemtestSchemaError("sweep", f"more than {MAX_RESULTS} lengths")
    for i, s in enumerate(sweep):
        _int(s, f"sweep[{i}]", minimum=1)
    if len(set(sweep)) != len(sweep):
        raise MemtestSchemaError("sweep", "lengths must be distinct")

    results = _require(doc, "results", "")
    if not isinstance(results, list):
        raise MemtestSchemaError("results", f"expected a list, got {_type_name(results)}")
    if len(results) > MAX_RESULTS:
        raise MemtestSchemaError("results", f"more than {MAX_RESULTS} results")
    position = {s: i for i, s in enumerate(sweep)}
    last = -1
    for i, res in enumerate(results):
        path = f"results[{i}]"
        _check_result(res, path, MAX_STEPS)
        seq = res["seq_len"]
        if seq not in position:
            raise MemtestSchemaError(f"{path}.seq_len", f"{seq} is not in sweep")
        if position[seq] <= last:
            raise MemtestSchemaError(f"{path}.seq_len", f"{seq} repeated or out of sweep order")
        last = position[seq]
    if len(results) != len(sweep):
        raise MemtestSchemaError(
            "results",
            f"{len(results)} results for {len(sweep)} sweep lengths: every length needs a result "
            "(lengths not reached are recorded as skipped)",
        )

    if "ranks" in doc and doc["ranks"] is not None:
        ranks = doc["ranks"]
        if not isinstance(ranks, list):
            raise MemtestSchemaError("ranks", f"expected a list, got {_type_name(ranks)}")
        if len(ranks) > MAX_RANKS:
            raise MemtestSchemaError("ranks", f"more than {MAX_RANKS} entries")
        for i, rank in enumerate(ranks):
            _check_rank(rank, f"ranks[{i}]")
            if rank["seq_len"] not in position:
                raise MemtestSchemaError(f"ranks[{i}].seq_len", "not in sweep")
    if "notes" in doc:
        notes = doc["notes"]
        if not isinstance(notes, list):
            raise MemtestSchemaError("notes", f"expected a list, got {_type_name(notes)}")
        for i, note in enumerate(notes):
            _str(note, f"notes[{i}]")
    return doc
