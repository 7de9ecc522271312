"""The result of reading a training config: trainfit fields, what was ignored and why, warnings.

It does not depend on `TrainingSetup` accepting every field: setup fields use the names of issue
10 (`stack`, `autocast`, `optimizer_impl`, `paged`, `lora_dropout`, `grad_accum`, `double_quant`,
`loss` incl. `liger`/`cce`, `checkpointing` incl. `offload`/`selective`, `train_embeddings`,
`base`), and `split_supported` tells which of them a given setup model accepts today.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args

from estimator.errors import EstimatorInputError
from estimator.parallel.layout import MODEL_KINDS

# Key names that usually change memory use; an unread key matching one of these is a warning.
MEMORY_WORDS = re.compile(
    r"offload|checkpoint|quant|lora|batch|seq|length|len$|precision|dtype|fp16|bf16|fp8|fp4|"
    r"optim|shard|fsdp|deepspeed|zero|pack|attn|attention|liger|kernel|compile|4bit|8bit|"
    r"memory|gradient|parallel|adapter|peft|dora|unsloth|loss|vocab|embed|cross_entropy|chunk",
    re.IGNORECASE,
)


def whole_number(value: object, key: str, minimum: int = 1) -> int:
    """A config's count (a length, a number of chunks) as an int, or bad input naming the key
    (`train_config.sequence_len`); `4096.0` is accepted, `"4k"`, `true` and `0` are not."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise EstimatorInputError(f"train_config.{key}", f"expected a whole number, got {value!r}")
    if value < minimum:
        raise EstimatorInputError(f"train_config.{key}", f"expected at least {minimum}")
    return int(value)


@dataclass(frozen=True)
class Ignored:
    key: str  # dotted path in the config file, e.g. `fsdp_config.offload_params`
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "reason": self.reason}


@dataclass
class TrainConfigMapping:
    """What a training config says, in trainfit's terms.

    model: `{"hub": id}`, `{"preset": id}` or `{"file": path}` (None when the config names none);
    setup: TrainingSetup fields (issue-10 names); seq_lens: the sequence length(s);
    run: run fields (`epochs`, `packing`, `packing_strategy`); origin: setup/run field -> the
    config key it came from; ignored: keys read but not honoured; warnings: unread keys that
    look memory-relevant, and other remarks.
    """

    format: str
    sources: list[str] = field(default_factory=list)
    model: dict[str, str] | None = None
    setup: dict[str, Any] = field(default_factory=dict)
    seq_lens: list[int] | None = None
    run: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    ignored: list[Ignored] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)

    # -- builders used by the readers -------------------------------------------------------
    def set(self, name: str, value: Any, key: str) -> None:
        """A setup field from config key `key` (a later call for the same field wins)."""
        if value is None:
            return
        self.setup[name] = value
        self.origin[name] = key

    def set_run(self, name: str, value: Any, key: str) -> None:
        if value is None:
            return
        self.run[name] = value
        self.origin[f"run.{name}"] = key

    def ignore(self, key: str, reason: str) -> None:
        if all(i.key != key for i in self.ignored):
            self.ignored.append(Ignored(key, reason))

    def get(self, data: dict[str, Any], key: str, prefix: str = "") -> Any:
        """`data[key]` (None when absent), marking the key as read."""
        self.read.add(prefix + key)
        return data.get(key)

    def count(self, data: dict[str, Any], key: str, default: int = 1) -> int:
        """`data[key]` as a whole number (`whole_number`), `default` when absent or equal to it
        (a default may lie outside whole_number's range: torchtune's -1, "the GPUs left")."""
        value = self.get(data, key)
        if value is None or value == default:
            return default
        return whole_number(value, key)

    def warn_unread(self, data: dict[str, Any], prefix: str = "") -> None:
        """A warning per key that was not read and whose name looks memory-relevant."""
        for key, value in data.items():
            path = prefix + str(key)
            if path in self.read or value in (None, False, "", [], {}):
                continue
            if MEMORY_WORDS.search(str(key)):
                self.warnings.append(
                    f"{path}: not read by trainfit's {self.format} reader; it may change memory "
                    f"use (value {value!r})"
                )

    def merge(self, other: TrainConfigMapping) -> None:
        """Add a companion file's mapping (DeepSpeed JSON, accelerate config): its fields win."""
        self.sources.extend(other.sources)
        for name, value in other.setup.items():
            if name == "checkpointing" and value == "gpu" and self.setup.get(name) == "offload":
                continue  # FSDP's activation checkpointing with the trainer's offload: offloaded
            if name == "parallel":
                value = _with_model_parallel(self.setup.get(name), value)
            self.set(name, value, f"{other.format}:{other.origin.get(name, name)}")
        for name, value in other.run.items():
            self.set_run(name, value, f"{other.format}:{other.origin.get('run.' + name, name)}")
        if other.model is not None and self.model is None:
            self.model = other.model
        if other.seq_lens is not None:
            self.seq_lens = other.seq_lens
        self.ignored.extend(other.ignored)
        self.warnings.extend(other.warnings)

    def fill_from(self, other: TrainConfigMapping) -> None:
        """Add a mapping that states less (a PEFT adapter config beside a training config): its
        fields fill only what this one does not state."""
        self.sources.extend(other.sources)
        for name, value in other.setup.items():
            if name not in self.setup:
                self.set(name, value, f"{other.format}:{other.origin.get(name, name)}")
        for name, value in other.run.items():
            if name not in self.run:
                self.set_run(name, value, f"{other.format}:{other.origin.get('run.' + name, name)}")
        if self.model is None and other.model is not None:
            self.model = other.model
            self.origin["model"] = f"{other.format}:{other.origin.get('model', 'model')}"
        if self.seq_lens is None:
            self.seq_lens = other.seq_lens
        self.ignored.extend(other.ignored)
        self.warnings.extend(other.warnings)

    # -- output ------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "sources": list(self.sources),
            "model": self.model,
            "setup": dict(self.setup),
            "seq_lens": self.seq_lens,
            "run": dict(self.run),
            "origin": dict(self.origin),
            "ignored": [i.as_dict() for i in self.ignored],
            "warnings": list(self.warnings),
        }


MODEL_PARALLEL = (*MODEL_KINDS, "sp")  # the `--parallel` items that are not data parallelism


def _with_model_parallel(mine: object, data_layout: object) -> object:
    """A companion file's data-parallel layout (a DeepSpeed JSON's `zero3`) over the trainer
    config's model-parallel items (axolotl's `tp=2,cp=2,fsdp`): `tp=2,cp=2,zero3`."""
    if not isinstance(mine, str) or not isinstance(data_layout, str):
        return data_layout
    if any(item.split("=")[0] in MODEL_PARALLEL for item in data_layout.split(",")):
        return data_layout  # the companion states its own model parallelism
    kept = [item for item in mine.split(",") if item.split("=")[0] in MODEL_PARALLEL]
    return ",".join([*kept, data_layout]) if kept else data_layout


def split_supported(
    setup: dict[str, Any], model_fields: dict[str, Any]
) -> tuple[dict[str, Any], list[Ignored]]:
    """Fields a setup model accepts (`TrainingSetup.model_fields`: name present and, for a
    Literal type, the value allowed) and the rest as Ignored entries naming the field."""
    accepted: dict[str, Any] = {}
    rejected: list[Ignored] = []
    for name, value in setup.items():
        info = model_fields.get(name)
        if info is None:
            rejected.append(Ignored(name, "not modelled by this trainfit version (issue 10)"))
            continue
        allowed = _literal_values(getattr(info, "annotation", None))
        if allowed and value not in allowed:
            rejected.append(
                Ignored(name, f"{value!r} is not one of {', '.join(map(str, allowed))} here")
            )
            continue
        accepted[name] = value
    return accepted, rejected


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    args = get_args(annotation)
    if not args:
        return ()
    if all(not isinstance(a, type) and a is not None for a in args):
        return args  # Literal["a", "b"]
    nested: tuple[Any, ...] = ()
    for a in args:  # Literal[...] | None
        nested += _literal_values(a)
    return nested
