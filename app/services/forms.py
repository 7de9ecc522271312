"""The estimate form (`GET /`): its fields as submitted, and the estimate requests they mean.

The form may tick several checkpointing and loss options; each combination is one
`EstimateRequest` (the seed's fit table compares exactly such combinations).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from estimator.request import EstimateRequest

CHECKPOINTING_ORDER = ("offload", "gpu", "none")
LOSS_ORDER = ("chunked", "full")
MAX_LENGTHS = 10_000_000


@dataclass
class FormValues:
    """What the user typed, to re-render the form after an error."""

    model_source: str = "preset"
    preset: str = ""
    config_text: str = ""
    model_name: str = ""
    method: str = "lora"
    lora_rank: str = "16"
    lora_targets: str = "all-linear"
    optimizer: str = "adamw"
    precision: str = "mixed"
    checkpointing: list[str] = field(default_factory=lambda: ["gpu"])
    loss: list[str] = field(default_factory=lambda: ["chunked"])
    batch: str = "1"
    seq_lens: str = "4096"
    gpus: list[str] = field(default_factory=list)
    gpus_extra: str = ""
    parallel: str = ""  # multi-GPU layout (estimator/parallel/), e.g. fsdp or fsdp=8,tp=2
    usable_fraction: str = "0.92"
    profile: str = "default"
    tokens: str = ""
    prices: str = ""

    @classmethod
    def from_form(cls, form: Any) -> FormValues:
        def one(name: str, default: str = "") -> str:
            value = form.get(name)
            return value.strip() if isinstance(value, str) else default

        def many(name: str) -> list[str]:
            return [v for v in form.getlist(name) if isinstance(v, str) and v]

        return cls(
            model_source=one("model_source", "preset"),
            preset=one("preset"),
            config_text=one("config_text"),
            model_name=one("model_name"),
            method=one("method", "lora"),
            lora_rank=one("lora_rank", "16"),
            lora_targets=one("lora_targets"),
            optimizer=one("optimizer", "adamw"),
            precision=one("precision", "mixed"),
            checkpointing=many("checkpointing"),
            loss=many("loss"),
            batch=one("batch", "1"),
            seq_lens=one("seq_lens"),
            gpus=many("gpus"),
            gpus_extra=one("gpus_extra"),
            parallel=one("parallel"),
            usable_fraction=one("usable_fraction", "0.92"),
            profile=one("profile", "default"),
            tokens=one("tokens"),
            prices=one("prices"),
        )


@dataclass(frozen=True)
class FormError:
    field: str
    message: str


class FormInvalid(Exception):
    def __init__(self, errors: list[FormError]) -> None:
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class LengthStats:
    count: int
    total: int
    p50: float
    p90: float
    maximum: int


def parse_lengths(raw: bytes) -> list[int]:
    """A dataset-lengths file: a JSON list of token counts, or one count per line."""
    text = raw.decode("utf-8", errors="strict").strip()
    if not text:
        raise ValueError("the file is empty")
    values: list[Any]
    if text.startswith("["):
        values = json.loads(text)
        if not isinstance(values, list):
            raise ValueError("expected a JSON list of integers")
    else:
        values = [line.split(",")[0].strip() for line in text.splitlines() if line.strip()]
    if len(values) > MAX_LENGTHS:
        raise ValueError(f"more than {MAX_LENGTHS} lengths")
    out: list[int] = []
    for i, v in enumerate(values):
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"entry {i + 1} ({str(v)[:20]!r}) is not an integer") from None
        if n < 0 or isinstance(v, bool):
            raise ValueError(f"entry {i + 1} is negative")
        out.append(n)
    return out


def length_stats(lengths: list[int]) -> LengthStats:
    ordered = sorted(lengths)
    q = statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1 else None
    return LengthStats(
        count=len(ordered),
        total=sum(ordered),
        p50=statistics.median(ordered),
        p90=q[8] if q else float(ordered[0]),
        maximum=ordered[-1],
    )


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
        out[gpu.strip()] = float(price)
    return out


def build_requests(
    values: FormValues,
    *,
    config_file: bytes | None = None,
    lengths_file: bytes | None = None,
) -> tuple[list[tuple[str, str, EstimateRequest]], LengthStats | None]:
    """The (checkpointing, loss, request) combinations the form asks for. Raises FormInvalid
    naming the form fields at fault."""
    errors: list[FormError] = []
    model: dict[str, Any] = {}
    if values.model_source == "config":
        text = values.config_text
        if config_file:
            try:
                text = config_file.decode("utf-8")
            except UnicodeDecodeError:
                errors.append(FormError("config_file", "not a UTF-8 text file"))
        try:
            config = json.loads(text) if text else None
            if not isinstance(config, dict):
                raise ValueError("paste or upload a config.json object")
            model = {"config": config}
            if values.model_name:
                model["name"] = values.model_name
        except (ValueError, RecursionError) as exc:
            errors.append(FormError("config_text", f"not a JSON object: {exc}"))
    else:
        if not values.preset:
            errors.append(FormError("preset", "pick a model preset"))
        model = {"preset": values.preset}

    def integer(name: str, text: str) -> int | None:
        try:
            return int(text)
        except ValueError:
            errors.append(FormError(name, f"{text!r} is not a whole number"))
            return None

    try:
        seq_lens = _ints(values.seq_lens)
        if not seq_lens:
            errors.append(FormError("seq_lens", "give at least one sequence length"))
    except ValueError:
        errors.append(FormError("seq_lens", "a comma-separated list of integers, e.g. 16000,32000"))
        seq_lens = []
    try:
        prices = _prices(values.prices)
    except ValueError as exc:
        errors.append(FormError("prices", str(exc)))
        prices = {}
    try:
        usable = float(values.usable_fraction or "0.92")
    except ValueError:
        errors.append(FormError("usable_fraction", "a number such as 0.92"))
        usable = 0.92
    tokens: float | None = None
    if values.tokens:
        try:
            tokens = float(values.tokens.replace("_", "").replace(",", ""))
        except ValueError:
            errors.append(FormError("tokens", "a number of tokens, e.g. 6400000"))
    stats: LengthStats | None = None
    if lengths_file:
        try:
            lengths = parse_lengths(lengths_file)
            stats = length_stats(lengths)
            if tokens is None:
                tokens = float(stats.total)
        except (ValueError, UnicodeDecodeError) as exc:
            errors.append(FormError("lengths_file", str(exc)))
    lora_rank = integer("lora_rank", values.lora_rank or "16")
    batch = integer("batch", values.batch or "1")
    extra = [g.strip() for g in values.gpus_extra.replace(";", ",").split(",") if g.strip()]
    gpus = list(dict.fromkeys([*values.gpus, *extra]))
    if not gpus:
        errors.append(FormError("gpus", "pick at least one GPU"))
    checkpointing = [c for c in CHECKPOINTING_ORDER if c in values.checkpointing] or ["gpu"]
    losses = [x for x in LOSS_ORDER if x in values.loss] or ["chunked"]
    if errors:
        raise FormInvalid(errors)

    targets = [t.strip() for t in values.lora_targets.replace("\n", ",").split(",") if t.strip()]
    out: list[tuple[str, str, EstimateRequest]] = []
    for ckpt in checkpointing:
        for loss in losses:
            setup: dict[str, Any] = {
                "method": values.method,
                "optimizer": values.optimizer,
                "precision": values.precision,
                "checkpointing": ckpt,
                "loss": loss,
                "batch": batch,
            }
            if values.parallel:
                setup["parallel"] = values.parallel
            if values.method in ("lora", "qlora"):
                setup["lora_rank"] = lora_rank
                setup["lora_targets"] = targets or ["all-linear"]
            body: dict[str, Any] = {
                "model": model,
                "setup": setup,
                "seq_lens": seq_lens,
                "gpus": gpus,
                "usable_fraction": usable,
                "profile": values.profile or "default",
                "prices": prices,
            }
            if tokens is not None:
                body["tokens"] = tokens
            try:
                out.append((ckpt, loss, EstimateRequest.model_validate(body)))
            except ValidationError as exc:
                raise FormInvalid(
                    [
                        FormError(_form_field(err["loc"]), err["msg"])
                        for err in exc.errors(include_url=False)
                    ]
                ) from None
    return out, stats


def _form_field(loc: tuple[Any, ...]) -> str:
    """Map a request path (setup.lora_rank) to the form field that fed it (lora_rank)."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("setup", "model"):
        parts = parts[1:] or parts
    if parts and parts[0] in ("config", "preset"):
        return "config_text" if parts[0] == "config" else "preset"
    return parts[0] if parts else "form"
