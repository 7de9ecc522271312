"""The estimate form (`GET /`): its fields as submitted, and the estimate requests they mean.

The form may tick several checkpointing and loss options; each combination is one
`EstimateRequest` (the seed's fit table compares exactly such combinations).

Uploaded files are turned into text fields (`config_text`, `lengths_text`,
`train_config_text`) as soon as they arrive, so the form can be re-rendered after an error
with what was uploaded, and every estimate can be written as a link (`query()`): the inputs
in the query string of `GET /estimate` re-render the same result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError

from estimator.errors import EstimatorInputError
from estimator.lora import split_targets
from estimator.request import EstimateRequest
from estimator.time.tokens import parse_lengths

CHECKPOINTING_ORDER = ("offload", "gpu", "none", "selective")
LOSS_ORDER = ("chunked", "full", "liger", "cce", "unsloth")
MODEL_SOURCES = ("preset", "hub", "config", "train_config")
MAX_LINK_CHARS = 16_000  # a permalink longer than this is not offered (browsers cope, people not)
LIST_FIELDS = ("checkpointing", "loss", "gpus")


PIPELINE_FIELDS = ("pp_schedule", "pp_virtual")
# form fields a setup-wide check names at the start of its message (the error goes next to them)
SETUP_WIDE_NAMED = (*PIPELINE_FIELDS, "objective", "loss", "batch")


@dataclass
class FormValues:
    """What the user typed (and uploaded, as text), to re-render the form after an error and to
    write the estimate's link."""

    model_source: str = "preset"
    preset: str = ""
    hub_id: str = ""
    config_text: str = ""
    model_name: str = ""
    train_config_text: str = ""
    train_config_format: str = ""
    train_config_name: str = ""
    stack: str = "hf"
    objective: str = (
        "sft"  # sft | dpo | dpo-precomputed | orpo | cpo | simpo (estimator/objective.py)
    )
    method: str = "lora"
    lora_rank: str = "16"
    lora_targets: str = "all-linear"
    optimizer: str = "adamw"
    precision: str = ""  # blank: the stack's (mixed; a full fine-tune on unsloth: bf16)
    checkpointing: list[str] = field(default_factory=lambda: ["gpu"])
    loss: list[str] = field(default_factory=lambda: ["chunked"])
    batch: str = "1"
    eval_batch: str = ""  # rows per device of an evaluation pass; blank: none priced
    eval_skip_logits: str = ""  # "on": that pass's Liger loss skips the logits (TRL)
    seq_lens: str = "4096"
    gpus: list[str] = field(default_factory=list)
    gpus_extra: str = ""
    parallel: str = ""  # multi-GPU layout (estimator/parallel/), e.g. fsdp or fsdp=8,tp=2
    pp_schedule: str = "1f1b"  # pipeline schedule under pp=N (estimator/parallel/schedule.py)
    pp_virtual: str = ""  # interleaved-1f1b: model chunks per rank
    usable_fraction: str = "0.92"
    profile: str = "default"
    tokens: str = ""
    epochs: str = "1"
    lengths_text: str = ""
    lengths_name: str = ""
    prices: str = ""
    calib_gpu: str = ""
    calib_seq: str = ""
    calib_tps: str = ""
    calib_source: str = ""

    @classmethod
    def from_form(cls, form: Any) -> FormValues:
        """From a submitted form or a query string (anything with get/getlist)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in LIST_FIELDS:
                values[f.name] = [v for v in form.getlist(f.name) if isinstance(v, str) and v]
            else:
                raw = form.get(f.name)
                if isinstance(raw, str):
                    values[f.name] = raw.strip()
        return cls(**values)

    def query(self) -> str:
        """The inputs as a query string (defaults left out): `GET /estimate?` + this
        re-renders the same estimate, `/?` + this pre-fills the form."""
        default = FormValues()
        pairs: list[tuple[str, str]] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in LIST_FIELDS:
                pairs += [(f.name, v) for v in value]
                if not value:
                    pairs.append((f.name, ""))
            elif value != getattr(default, f.name):
                pairs.append((f.name, value))
        return urlencode(pairs)


@dataclass(frozen=True)
class FormError:
    field: str
    message: str


class FormInvalid(Exception):
    def __init__(self, errors: list[FormError]) -> None:
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))
        self.errors = errors


def _ints(text: str) -> list[int]:
    return [int(p.replace("_", "")) for p in text.replace(";", ",").split(",") if p.strip()]


def _prices(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.replace(";", ",").replace("\n", ",").split(","):
        if not part.strip():
            continue
        gpu, sep, price = part.partition("=")
        if not sep:
            raise ValueError(f"write prices as gpu=USD per hour, e.g. h200=5.0 (got {part!r})")
        try:
            out[gpu.strip()] = float(price)
        except ValueError:
            raise ValueError(f"{price.strip()!r} is not a number of USD per hour") from None
    return out


def lengths_format(name: str, text: str) -> str:
    """The lengths file's format from its name (as the CLI does), else from its content."""
    suffix = name.lower().rsplit(".", 1)[-1] if "." in name else ""
    if suffix in ("csv", "jsonl", "json"):
        return suffix
    stripped = text.lstrip()
    if stripped.startswith("["):
        return "json"
    if stripped.startswith("{"):
        return "jsonl"
    return "csv" if "," in text else "text"


def clean_message(message: str) -> str:
    """Pydantic's messages without its framework prefixes."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message


def form_field(loc: tuple[Any, ...] | str) -> str:
    """The form field behind a request path (`setup.lora_rank` -> `lora_rank`,
    `model.config.x` -> `config_text`)."""
    parts = loc.split(".") if isinstance(loc, str) else [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    if not parts:
        return "form"
    head = parts[0]
    if head == "model":
        sub = parts[1] if len(parts) > 1 else ""
        return {"preset": "preset", "hub": "hub_id", "name": "model_name"}.get(sub, "config_text")
    if head in ("config", "num_hidden_layers", "hidden_size", "vocab_size"):
        return "config_text"
    if head == "train_config":
        return "train_config_text"
    if head == "setup":
        field = parts[1] if len(parts) > 1 else "method"
        return "method" if field == "base" else field  # the form picks the base by its method
    if head in ("dataset_lengths", "dataset"):
        return "lengths_file"
    if head == "calibration":
        return "calibration"
    if head == "seq_len":
        return "seq_lens"
    return head


def _model(values: FormValues, errors: list[FormError]) -> dict[str, Any] | None:
    """The request's `model`, or None when it comes from the training config."""
    source = values.model_source
    if source == "train_config":
        if not values.train_config_text:
            errors.append(FormError("train_config_file", "upload or paste the training config"))
        return None
    if source == "hub":
        if "/" not in values.hub_id:
            errors.append(
                FormError("hub_id", "a Hugging Face model id, ORG/NAME or ORG/NAME@revision")
            )
        return {"hub": values.hub_id}
    if source == "config":
        try:
            config = json.loads(values.config_text) if values.config_text else None
        except (ValueError, RecursionError) as exc:
            errors.append(FormError("config_text", f"not JSON: {exc}"))
            return {}
        if not isinstance(config, dict):
            errors.append(FormError("config_text", "upload or paste a config.json object"))
            return {}
        model: dict[str, Any] = {"config": config}
        if values.model_name:
            model["name"] = values.model_name
        return model
    if not values.preset:
        errors.append(FormError("preset", "pick a model preset"))
    return {"preset": values.preset}


def _number(
    errors: list[FormError], name: str, text: str, example: str, integer: bool = False
) -> float | None:
    if not text:
        return None
    try:
        cleaned = text.replace("_", "").replace(",", "")
        return int(cleaned) if integer else float(cleaned)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        errors.append(FormError(name, f"{text!r} is not {kind}, e.g. {example}"))
        return None


def _calibration(values: FormValues, errors: list[FormError]) -> dict[str, Any] | None:
    if not (values.calib_gpu or values.calib_tps):
        return None
    seq = _number(errors, "calibration", values.calib_seq, "16000", integer=True)
    tps = _number(errors, "calibration", values.calib_tps, "1500.5")
    if seq is None or tps is None or not values.calib_gpu:
        errors.append(FormError("calibration", "a calibration needs a GPU, a length and tokens/s"))
        return None
    return {"gpu": values.calib_gpu, "seq_len": int(seq), "tokens_per_second": tps}


def build_requests(values: FormValues) -> list[tuple[str, str, EstimateRequest]]:
    """The (checkpointing, loss, request) combinations the form asks for. Raises FormInvalid
    with every field at fault (all at once, each named after its form field)."""
    errors: list[FormError] = []
    model = _model(values, errors)
    has_train_config = bool(values.train_config_text)
    seq_lens: list[int] = []
    try:
        seq_lens = _ints(values.seq_lens)
        if not seq_lens and not has_train_config:
            errors.append(FormError("seq_lens", "give at least one sequence length"))
    except ValueError:
        errors.append(FormError("seq_lens", "a comma-separated list of integers, e.g. 16000,32000"))
    try:
        prices = _prices(values.prices)
    except ValueError as exc:
        errors.append(FormError("prices", str(exc)))
        prices = {}
    usable = _number(errors, "usable_fraction", values.usable_fraction, "0.92")
    tokens = _number(errors, "tokens", values.tokens, "6400000")
    epochs = _number(errors, "epochs", values.epochs, "1 or 2.5")
    lengths: list[int] | None = None
    if values.lengths_text:
        try:
            fmt = lengths_format(values.lengths_name, values.lengths_text)
            lengths = parse_lengths(values.lengths_text, fmt, "lengths_file")
        except EstimatorInputError as exc:
            errors.append(FormError("lengths_file", exc.message))
    calibration = _calibration(values, errors)
    rank = _number(errors, "lora_rank", values.lora_rank or "16", "16", integer=True)
    batch = _number(errors, "batch", values.batch or "1", "1", integer=True)
    eval_batch = _number(errors, "eval_batch", values.eval_batch, "8", integer=True)
    pipeline: dict[str, Any] = {}
    if values.pp_schedule and values.pp_schedule != "1f1b":
        pipeline["pp_schedule"] = values.pp_schedule
    if values.pp_virtual:
        pipeline["pp_virtual"] = _number(errors, "pp_virtual", values.pp_virtual, "2", integer=True)
    extra = [g.strip() for g in values.gpus_extra.replace(";", ",").split(",") if g.strip()]
    gpus = list(dict.fromkeys([*values.gpus, *extra]))
    if not gpus:
        errors.append(FormError("gpus", "pick at least one GPU"))
    checkpointing = [c for c in CHECKPOINTING_ORDER if c in values.checkpointing] or ["gpu"]
    losses = [x for x in LOSS_ORDER if x in values.loss] or ["chunked"]
    targets = split_targets(values.lora_targets)  # a `re:` pattern keeps its commas

    out: list[tuple[str, str, EstimateRequest]] = []
    for ckpt in checkpointing:
        for loss in losses:
            if has_train_config:
                # the training config states the setup; the form adds only the comparisons
                setup: dict[str, Any] = {}
                if len(checkpointing) > 1:
                    setup["checkpointing"] = ckpt
                if len(losses) > 1:
                    setup["loss"] = loss
                if values.parallel:
                    setup["parallel"] = values.parallel
                setup.update(pipeline)
            else:
                setup = {
                    "stack": values.stack or "hf",
                    "method": values.method,
                    "optimizer": values.optimizer,
                    **({"precision": values.precision} if values.precision else {}),
                    "checkpointing": ckpt,
                    "loss": loss,
                    "batch": batch,
                }
                if values.parallel:
                    setup["parallel"] = values.parallel
                setup.update(pipeline)
                if values.method in ("lora", "qlora"):
                    setup["lora_rank"] = rank
                    setup["lora_targets"] = targets or ["all-linear"]
            if values.objective and values.objective != "sft":
                setup["objective"] = values.objective
            if eval_batch is not None:
                setup["eval_batch"] = eval_batch
                if values.eval_skip_logits and setup.get("loss") == "liger":
                    setup["eval_skip_logits"] = True  # the Liger rows of a comparison
            body: dict[str, Any] = {
                "setup": setup,
                "gpus": gpus,
                "usable_fraction": usable if usable is not None else 0.92,
                "profile": values.profile or "default",
                "prices": prices,
                "epochs": epochs if epochs is not None else 1.0,
            }
            if model is not None:
                body["model"] = model
            if seq_lens:
                body["seq_lens"] = seq_lens
            if has_train_config:
                body["train_config"] = {
                    "text": values.train_config_text,
                    "format": values.train_config_format or None,
                }
            if lengths is not None:
                body["dataset_lengths"] = lengths
            elif tokens is not None:
                body["tokens"] = tokens
            if calibration is not None:
                body["calibration"] = calibration
            if errors:
                continue
            try:
                out.append((ckpt, loss, EstimateRequest.model_validate(body)))
            except ValidationError as exc:
                for err in exc.errors(include_url=False):
                    message = clean_message(str(err["msg"]))
                    field_name = form_field(err["loc"])
                    named = message.split(":", 1)[0]
                    if field_name == "method" and named in SETUP_WIDE_NAMED:
                        field_name = named  # a setup-wide check whose message names the field
                    if err["type"] == "train_config":  # "{field}: {message}" of the mapping
                        field_name = "train_config_text"
                    found = FormError(field_name, message)
                    if found not in errors:
                        errors.append(found)
    if errors:
        raise FormInvalid(errors)
    return out


def link_query(values: FormValues) -> str | None:
    """The query string of the estimate's link, or None when the inputs are too long for one."""
    query = values.query()
    return query if len(query) <= MAX_LINK_CHARS else None
