"""An estimate (or check) request validated without pydantic, for the command line's start-up
(issue 17: building the pydantic request models costs ~0.1 s, a third of a one-preset
`trainfit estimate`; `check_request` does the same for `trainfit check`).

`estimate_request(body)` returns the same request the pydantic model would
(`estimator.request.EstimateRequest.model_validate(body)`), as plain objects with the same
attributes, when every value of the body is plainly valid: of the exact type a field takes
(an `int` for an int field, an `int` or `float` for a float field, a `str` among a literal's
choices), within the field's bounds, and accepted by the setup's rules
(`estimator.setup_rules`, the functions the pydantic model's validators call). Anything else —
a value pydantic would coerce (`"16"`, `16.0` for an int) or reject, a calibration, a training
config — goes to the pydantic model, which accepts it or raises the error the user sees. So a
plain request is never one pydantic would refuse, and every error message is pydantic's.

The field tables below repeat the pydantic models' declarations (`estimator.setup`,
`estimator.request`); `tests/estimator/test_plain_request.py` checks them against the models'
fields (names, order, defaults, bounds, choices) and the plain requests against the pydantic
ones on generated bodies."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

from estimator import setup_choices as choices
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

if TYPE_CHECKING:
    from estimator.request import CheckRequest, EstimateRequest

# limits of estimator.request
MAX_SEQ_LEN = 100_000_000
MAX_SEQ_LENS = 256
MAX_NAME_CHARS = 200
MAX_GPU_OPTION_CHARS = 64
MAX_CONFIG_KEYS = 2000
MAX_DATASET_LENGTHS = 10_000_000

INF = float("inf")
REQUIRED = object()  # the default of a field the body must give


class _Defer(Exception):
    """A value the plain rules do not vouch for: the pydantic model decides."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field: its kind (`literal`, `int`, `float`, `bool`, `str`, `str_list`, `int_list`,
    `float_dict`, `dict`), default, whether None is allowed, and its bounds: `low`/`high` (with
    `*_open` for > and <) for numbers, `min_len`/`max_len` for strings and containers."""

    kind: str
    default: Any
    optional: bool = False
    choices: tuple[str, ...] = ()
    low: float = -INF
    high: float = INF
    low_open: bool = False
    high_open: bool = False
    min_len: int = 0
    max_len: int | None = None

    def value(self, v: Any) -> Any:
        """The validated value of `v`, or `_Defer`."""
        if v is None:
            if self.optional:
                return None
            raise _Defer
        kind, t = self.kind, type(v)
        if kind == "literal":
            if t is str and v in self.choices:
                return v
        elif kind == "bool":
            if t is bool:
                return v
        elif kind == "int":
            if t is int and self._in_bounds(v):
                return v
        elif kind == "float":
            if (t is float or t is int) and self._in_bounds(v):
                return float(v)
        elif kind == "str":
            if t is str and self._sized(v):
                return v
        elif kind == "str_list":
            if t is list and self._sized(v) and all(type(x) is str for x in v):
                return list(v)
        elif kind == "int_list":
            if t is list and self._sized(v) and all(type(x) is int for x in v):
                return list(v)
        elif kind == "float_dict":  # dict[str, float]
            if t is dict and self._sized(v) and all(type(k) is str for k in v) and _numbers(v):
                return {k: float(x) for k, x in v.items()}
        elif kind == "dict" and t is dict and self._sized(v) and all(type(k) is str for k in v):
            return dict(v)
        raise _Defer

    def _in_bounds(self, v: float) -> bool:
        low_ok = v > self.low if self.low_open else v >= self.low
        high_ok = v < self.high if self.high_open else v <= self.high
        return low_ok and high_ok

    def _sized(self, v: Any) -> bool:
        return len(v) >= self.min_len and (self.max_len is None or len(v) <= self.max_len)


def _numbers(mapping: dict[str, Any]) -> bool:
    return all(type(x) is float or type(x) is int for x in mapping.values())


def _lit(literal: Any, default: Any, optional: bool = False) -> Field:
    return Field("literal", default, optional=optional, choices=get_args(literal))


SETUP_FIELDS: dict[str, Field] = {  # estimator.setup.TrainingSetup, in its order
    "stack": _lit(choices.StackName, "hf"),
    "method": _lit(choices.Method, "full"),
    "objective": _lit(choices.Objective, "sft"),
    "lora_rank": Field("int", 16, low=1, high=65536),
    "lora_alpha": Field("float", None, optional=True, low=0, low_open=True, high=1e6),
    "lora_dropout": Field("float", None, optional=True, low=0, high=1, high_open=True),
    "lora_targets": Field("str_list", ["all-linear"], max_len=MAX_LORA_TARGETS),
    "adapter_dtype": _lit(choices.AdapterDtype, "fp32"),
    "optimizer": _lit(choices.Optimizer, "adamw"),
    "precision": _lit(choices.Precision, "mixed"),
    "checkpointing": _lit(choices.Checkpointing, "gpu"),
    "loss": _lit(choices.Loss, "full"),
    "loss_chunk": Field("int", None, optional=True, low=1, high=10**9),
    "batch": Field("int", 1, low=1, high=MAX_BATCH),
    "padded_batches": Field("bool", False),
    "grad_accum": Field("int", None, optional=True, low=1, high=MAX_BATCH),
    "eval_batch": Field("int", None, optional=True, low=1, high=MAX_BATCH),
    "eval_skip_logits": Field("bool", False),
    "autocast": Field("bool", None, optional=True),
    "optimizer_impl": _lit(choices.OptimizerImpl, None, optional=True),
    "paged": Field("bool", None, optional=True),
    "double_quant": Field("bool", None, optional=True),
    "train_embeddings": Field("bool", None, optional=True),
    "base": _lit(choices.Base, None, optional=True),
    "kbit_prepare": Field("bool", None, optional=True),
    "compile": Field("bool", None, optional=True),
    "liger_kernels": Field("bool", None, optional=True),
    "quantize_experts": Field("bool", None, optional=True),
    "sharding": _lit(choices.Sharding, "none"),
    "num_gpus": Field("int", 1, low=1, high=MAX_GPUS),
    "attention": _lit(choices.Attention, "sdpa"),
    "parallel": Field("str", None, optional=True, max_len=200),
    "fsdp_wrap": Field("str", "layer", max_len=60),
    "reshard_after_forward": Field("bool", True),
    "offload": _lit(choices.Offload, "none"),
    "pp_schedule": _lit(choices.PPSchedule, "1f1b"),
    "pp_virtual": Field("int", None, optional=True, low=1, high=1024),
}
# the field validators of TrainingSetup: they run on a given value, not on the default
SETUP_FIELD_RULES = {
    "parallel": parallel_field,
    "fsdp_wrap": wrap_field,
    "lora_targets": targets_field,
}

MODEL_FIELDS: dict[str, Field] = {  # estimator.request.ModelInput
    "config": Field("dict", None, optional=True, max_len=MAX_CONFIG_KEYS),
    "preset": Field("str", None, optional=True, min_len=1, max_len=MAX_NAME_CHARS),
    "hub": Field("str", None, optional=True, min_len=1, max_len=300),
    "params": Field("float", None, optional=True, low=1, high=1e15),
    "hidden": Field("int", None, optional=True, low=1, high=10**7),
    "layers": Field("int", None, optional=True, low=1, high=10**6),
    "vocab": Field("int", None, optional=True, low=1, high=10**9),
    "intermediate": Field("int", None, optional=True, low=1, high=10**8),
    "name": Field("str", None, optional=True, max_len=200),
}

REQUEST_FIELDS: dict[str, Field] = {  # estimator.request.EstimateRequest, less model and setup
    "seq_lens": Field("int_list", [4096], min_len=1, max_len=MAX_SEQ_LENS),
    "gpus": Field("str_list", ["h100-80gb"], min_len=1, max_len=64),
    "usable_fraction": Field("float", 0.92, low=0, low_open=True, high=1),
    "profile": Field("str", "default", min_len=1, max_len=MAX_NAME_CHARS),
    "tokens": Field("float", None, optional=True, low=0, low_open=True, high=1e16),
    "target_tokens": Field("literal", None, optional=True, choices=("chinchilla",)),
    "dataset_lengths": Field(
        "int_list", None, optional=True, min_len=1, max_len=MAX_DATASET_LENGTHS
    ),
    "epochs": Field("float", 1.0, low=0, low_open=True, high=1e6),
    "overflow": Field("literal", "drop", choices=("drop", "truncate")),
    "prices": Field("float_dict", {}, max_len=64),
}


CHECK_FIELDS: dict[str, Field] = {  # estimator.request.CheckRequest, less model and setup
    "seq_lens": Field("int_list", REQUIRED, min_len=1, max_len=MAX_SEQ_LENS),
    "gpu": Field("str", REQUIRED, min_len=1, max_len=MAX_GPU_OPTION_CHARS),
    "usable_fraction": REQUEST_FIELDS["usable_fraction"],
    "profile": REQUEST_FIELDS["profile"],
}


class PlainSetup:
    """A validated `TrainingSetup`'s values, with the parts of the pydantic model's interface
    the estimator uses: the fields as attributes (in `__dict__`, in the model's order),
    `model_fields_set`, `model_copy`, `model_dump`, `is_adapter`. Setting a field adds it to
    `model_fields_set`, as pydantic's `BaseModel.__setattr__` does."""

    __slots__ = ("__dict__", "_fields_set")
    _fields_set: set[str]

    def __init__(self, values: dict[str, Any], fields_set: set[str]) -> None:
        self.__dict__.update(values)
        object.__setattr__(self, "_fields_set", fields_set)

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__[name] = value
        self._fields_set.add(name)

    def __eq__(self, other: object) -> bool:
        if type(other) is not PlainSetup:
            return NotImplemented
        return self.__dict__ == other.__dict__ and self._fields_set == other._fields_set

    __hash__ = None  # type: ignore[assignment]  # mutable, as the pydantic model

    @property
    def model_fields_set(self) -> set[str]:
        return self._fields_set

    @property
    def is_adapter(self) -> bool:
        return bool(self.__dict__["method"] in ("lora", "qlora"))

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any:
        """pydantic's `model_copy`: the fields copied (deeply with `deep`), `update` set as
        given (not validated), its keys added to the fields set."""
        values = copy.deepcopy(self.__dict__) if deep else dict(self.__dict__)
        copied = PlainSetup(values, set(self._fields_set))
        if update:
            copied.__dict__.update(update)
            copied._fields_set.update(update)
        return copied

    def model_dump(self) -> dict[str, Any]:
        return {
            k: copy.deepcopy(v) if type(v) in (list, dict) else v for k, v in self.__dict__.items()
        }


class PlainModelInput:
    """A validated `ModelInput`'s fields as attributes."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


class PlainEstimateRequest:
    """A validated `EstimateRequest` without a calibration or a training config."""

    calibration = None
    train_config = None
    train_config_report = None

    def __init__(self, model: PlainModelInput, setup: PlainSetup, values: dict[str, Any]) -> None:
        self.model, self.setup = model, setup
        self.__dict__.update(values)


class PlainCheckRequest:
    """A validated `CheckRequest` without a training config."""

    train_config = None
    train_config_report = None
    seq_lens: list[int]
    gpu: str
    usable_fraction: float
    profile: str

    def __init__(self, model: PlainModelInput, setup: PlainSetup, values: dict[str, Any]) -> None:
        self.model, self.setup = model, setup
        self.__dict__.update(values)

    def as_estimate_request(self) -> PlainEstimateRequest:
        """`CheckRequest.as_estimate_request`: the estimate request of the one GPU."""
        values = {k: copy.copy(f.default) for k, f in REQUEST_FIELDS.items()}
        values.update(
            seq_lens=list(self.seq_lens),
            gpus=[self.gpu],
            usable_fraction=self.usable_fraction,
            profile=self.profile,
        )
        return PlainEstimateRequest(self.model, self.setup, values)


def _values(fields: dict[str, Field], data: dict[str, Any]) -> dict[str, Any]:
    if not data.keys() <= fields.keys():  # extra="forbid"
        raise _Defer
    out = {}
    for name, f in fields.items():
        if name in data:
            out[name] = f.value(data[name])
        elif f.default is REQUIRED:
            raise _Defer
        else:
            out[name] = copy.copy(f.default)
    return out


def plain_setup(data: Any) -> PlainSetup:
    """The setup of `data` by `TrainingSetup`'s fields and rules, or `_Defer`."""
    if type(data) is not dict:
        raise _Defer
    values = _values(SETUP_FIELDS, data)
    try:
        for name, rule in SETUP_FIELD_RULES.items():
            if name in data:
                values[name] = rule(values[name])  # type: ignore[operator]
        setup = PlainSetup(values, set(data))
        sharding_needs_gpus(setup)
        resolve_from_stack(setup, setup.model_fields_set)
    except Exception:  # the rule's error is pydantic's to report
        raise _Defer from None
    return setup


def _plain_model(data: Any) -> PlainModelInput:
    if type(data) is not dict:
        raise _Defer
    values = _values(MODEL_FIELDS, data)
    given = [k for k in ("config", "preset", "hub", "params") if values[k] is not None]
    if len(given) != 1:
        raise _Defer
    return PlainModelInput(values)


def _plain_request(body: dict[str, Any]) -> PlainEstimateRequest:
    if type(body) is not dict or "model" not in body:
        raise _Defer
    rest = {k: v for k, v in body.items() if k not in ("model", "setup")}
    values = _values(REQUEST_FIELDS, rest)
    if any(not 1 <= s <= MAX_SEQ_LEN for s in values["seq_lens"]):
        raise _Defer
    if any(not 0 <= p <= 10_000 for p in values["prices"].values()):
        raise _Defer
    setup = plain_setup(body.get("setup", {}))
    return PlainEstimateRequest(_plain_model(body["model"]), setup, values)


def _plain_check(body: dict[str, Any]) -> PlainCheckRequest:
    if type(body) is not dict or "model" not in body:
        raise _Defer
    rest = {k: v for k, v in body.items() if k not in ("model", "setup")}
    values = _values(CHECK_FIELDS, rest)
    if any(not 1 <= s <= MAX_SEQ_LEN for s in values["seq_lens"]):
        raise _Defer  # `as_estimate_request` raises it, through pydantic
    setup = plain_setup(body.get("setup", {}))
    return PlainCheckRequest(_plain_model(body["model"]), setup, values)


def check_request(body: dict[str, Any]) -> CheckRequest | PlainCheckRequest:
    """`estimate_request`'s rule for a check request."""
    try:
        return _plain_check(body)
    except _Defer:
        from estimator.request import CheckRequest

        return CheckRequest.model_validate(body)


def estimate_request(body: dict[str, Any]) -> EstimateRequest | PlainEstimateRequest:
    """The request of `body`: plain when every value is plainly valid, else the pydantic
    model's (which raises the user's error)."""
    try:
        return _plain_request(body)
    except _Defer:
        from estimator.request import EstimateRequest

        return EstimateRequest.model_validate(body)
