"""`--parallel` layouts: how the GPUs of a run are split, parsed from text such as
`fsdp=8,tp=8`, `zero3`, `dp`, `hsdp`, `tp=4,sp,pp=2`, `cp=4,fsdp`, `ep=8,fsdp`.

Degrees multiply to the GPU count (Megatron-LM's rule: world size = dp x tp x pp x cp,
megatron/core/parallel_state.py `initialize_model_parallel`; torchtitan's ParallelDims checks
dp_replicate x dp_shard x cp x tp x pp == world size). One data-parallel item may be given
without a degree: it takes the GPUs the others leave. `ep` is not a factor of the product:
expert parallelism reuses the data-parallel ranks (Megatron: expert_model_parallel_size divides
the data-parallel x context-parallel size; torchtitan borrows ep from dp_shard x cp).

Items
  dp[=N]              DDP replicas (torch.nn.parallel.DistributedDataParallel); with fsdp: HSDP
  fsdp[=N]            torch FSDP2 fully_shard over N ranks
  hsdp                fsdp inside a node, dp replicas across nodes (FSDP2 2-D mesh)
  zero1|zero2|zero3[=N]  DeepSpeed ZeRO stage over N ranks
  tp=N [,sp]          Megatron tensor parallelism (sp: sequence parallelism on top)
  cp=N                context parallelism (ring attention: the sequence split over N ranks)
  pp=N                pipeline parallelism (schedule: --pp-schedule, default 1F1B)
  ep=N                expert parallelism (MoE experts split over N of the data-parallel ranks)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from estimator.errors import EstimatorInputError

DATA_KINDS = ("dp", "fsdp", "zero1", "zero2", "zero3")
SHARDED_KINDS = ("fsdp", "zero1", "zero2", "zero3")
MODEL_KINDS = ("tp", "cp", "pp", "ep")
MAX_DEGREE = 100_000
MAX_TEXT = 200
FIELD = "setup.parallel"

_ITEM = re.compile(r"^(?P<name>[a-z0-9]+)(?:=(?P<degree>\d+))?$")
_WRAP = re.compile(r"^(?:layer|block-of-(?P<n>\d+))$")
# Modules a `+` in `fsdp_wrap` makes FSDP units of their own (torchtune's
# `custom_sharded_layers`), with the names torchtune's and transformers' Llama give them.
SEPARATE_UNITS = {
    "embeddings": "embeddings",
    "tok_embeddings": "embeddings",
    "embed_tokens": "embeddings",
    "lm_head": "lm_head",
    "output": "lm_head",
    # torchtitan's `fully_shard([model.norm, model.lm_head], reshard_after_forward=policy ==
    # "always")`: the head (with the final norm) as one unit kept unsharded after its forward
    # under the default policy (torchtitan 0.3.0 distributed/fsdp.py:200-207)
    "norm_lm_head": "norm_lm_head",
}
# Names of the same module: at most one of them in a wrap.
_SAME_MODULE = ("lm_head", "norm_lm_head")
WRAP_FIELD = "setup.fsdp_wrap"


@dataclass(frozen=True)
class LayoutText:
    """A parsed `--parallel` text; degrees not given are None (resolved against the GPUs)."""

    text: str
    data: str = "dp"  # dp | fsdp | zero1 | zero2 | zero3
    shard: int | None = 1  # ranks the fsdp / zero states are sharded over
    replicate: int | None = 1  # DDP replicas (HSDP: replicas of the sharded group)
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    ep: int = 1
    hsdp: bool = False


def model_splits(layout: LayoutText | Layout) -> list[str]:
    """The model-splitting degrees above 1 of a layout, as `tp=2` items (tp, pp, cp, ep)."""
    return [f"{k}={getattr(layout, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(layout, k) > 1]


@dataclass(frozen=True)
class Layout:
    """A layout resolved for a GPU count: every degree known, product == gpus."""

    data: str
    shard: int
    replicate: int
    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    ep: int = 1
    wrap_layers: int = 1  # FSDP2 unit: 1 decoder layer (`layer`) or a block of N
    reshard_after_forward: bool = True
    offload: str = "none"  # none | optimizer | params
    schedule: str = "1f1b"  # pipeline schedule (estimator/parallel/schedule.py)
    virtual: int = 1  # model chunks (virtual stages) per pipeline rank
    # FSDP2 units of their own besides the layers: `embeddings`, `lm_head` (else in the root)
    separate_units: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.replicate * self.shard * self.tp * self.cp * self.pp

    @property
    def data_parallel(self) -> int:
        """Ranks that each run their own micro-batches (replicas x shards)."""
        return self.replicate * self.shard

    @property
    def model_parallel(self) -> int:
        """GPUs that together hold one replica of the model and run one micro-batch."""
        return self.tp * self.cp * self.pp

    @property
    def text(self) -> str:
        """Canonical text (`fsdp=8,tp=8`)."""
        parts = []
        if self.data == "dp":
            if self.replicate > 1:
                parts.append(f"dp={self.replicate}")
        else:
            if self.replicate > 1:
                parts.append(f"dp={self.replicate}")
            parts.append(f"{self.data}={self.shard}")
        for name in ("tp", "cp", "pp", "ep"):
            value = getattr(self, name)
            if value > 1:
                parts.append(f"{name}={value}")
        if self.sp:
            parts.append("sp")
        return ",".join(parts) or "dp=1"


def parse_wrap(text: str) -> int:
    """`layer` -> 1 decoder layer per FSDP unit; `block-of-N` -> N layers per unit."""
    return parse_wrap_units(text)[0]


def parse_wrap_units(text: str) -> tuple[int, tuple[str, ...]]:
    """`layer` / `block-of-N`, optionally `+embeddings` and / or `+lm_head` (or
    `+norm_lm_head`): (layers per unit, the modules wrapped as units of their own, sorted).
    torchtune's `custom_sharded_layers: ['tok_embeddings', 'output']` is
    `layer+embeddings+lm_head` (its names are accepted too); torchtitan's is
    `layer+embeddings+norm_lm_head` (the head's unit not resharded after forward)."""
    head, *extra = text.strip().lower().replace(" ", "").split("+")
    m = _WRAP.match(head)
    if m is None:
        raise EstimatorInputError(
            WRAP_FIELD,
            f"{text!r}: use layer or block-of-N, optionally +embeddings / +lm_head / +norm_lm_head",
        )
    n = int(m.group("n") or 1)
    if not 1 <= n <= MAX_DEGREE:
        raise EstimatorInputError(WRAP_FIELD, f"block-of-{n}: N must be 1..{MAX_DEGREE}")
    units: list[str] = []
    for name in extra:
        unit = SEPARATE_UNITS.get(name)
        if unit is None:
            known = ", ".join(SEPARATE_UNITS)
            raise EstimatorInputError(WRAP_FIELD, f"+{name}: not a module to wrap; known: {known}")
        if unit in units:
            raise EstimatorInputError(WRAP_FIELD, f"+{name}: {unit} is given twice")
        if unit in _SAME_MODULE and any(u in _SAME_MODULE for u in units):
            raise EstimatorInputError(WRAP_FIELD, f"+{name}: the lm_head is given twice")
        units.append(unit)
    return n, tuple(sorted(units))


def wrap_text(n: int, units: tuple[str, ...]) -> str:
    """Canonical `fsdp_wrap` text of `parse_wrap_units`' result."""
    return "+".join(["layer" if n == 1 else f"block-of-{n}", *units])


def parse_parallel(text: str) -> LayoutText:
    """Syntax only; degrees against the GPU count and the model are checked by `resolve` and
    `check_model`. Errors name `setup.parallel`."""
    raw = text.strip().lower().replace(" ", "")
    if not raw or len(raw) > MAX_TEXT:
        raise EstimatorInputError(FIELD, f"give items such as fsdp=8,tp=8 (<= {MAX_TEXT} chars)")
    seen: dict[str, int | None] = {}
    for item in raw.split(","):
        m = _ITEM.match(item)
        if m is None:
            raise EstimatorInputError(FIELD, f"{item!r} is not NAME or NAME=N")
        name = "dp" if m.group("name") == "ddp" else m.group("name")
        degree = int(m.group("degree")) if m.group("degree") else None
        if name not in (*DATA_KINDS, *MODEL_KINDS, "sp", "hsdp"):
            known = ", ".join((*DATA_KINDS, "hsdp", *MODEL_KINDS, "sp"))
            raise EstimatorInputError(FIELD, f"unknown item {name!r}; known: {known}")
        if name in seen:
            raise EstimatorInputError(FIELD, f"{name} is given twice")
        if degree is not None and not 1 <= degree <= MAX_DEGREE:
            raise EstimatorInputError(FIELD, f"{name}={degree}: degrees are 1..{MAX_DEGREE}")
        if name in MODEL_KINDS and degree is None:
            raise EstimatorInputError(FIELD, f"{name} needs a degree, e.g. {name}=2")
        if name in ("sp", "hsdp") and degree is not None:
            raise EstimatorInputError(FIELD, f"{name} takes no degree")
        seen[name] = degree
    return _layout_text(raw, seen)


def _layout_text(raw: str, seen: dict[str, int | None]) -> LayoutText:
    sharded = [k for k in SHARDED_KINDS if k in seen]
    if len(sharded) > 1:
        raise EstimatorInputError(FIELD, f"choose one of {', '.join(sharded)}")
    hsdp = "hsdp" in seen
    if hsdp and (sharded or "dp" in seen):
        raise EstimatorInputError(FIELD, "hsdp is fsdp inside a node and dp across: give it alone")
    data = "fsdp" if hsdp else (sharded[0] if sharded else "dp")
    if data.startswith("zero") and "dp" in seen:
        raise EstimatorInputError(
            FIELD, f"{data} shards over every data-parallel rank; drop dp (HSDP is fsdp + dp)"
        )
    if "sp" in seen and "tp" not in seen:
        raise EstimatorInputError(FIELD, "sp (sequence parallelism) needs tp=N")
    shard: int | None = 1
    replicate: int | None = 1
    if hsdp:
        shard, replicate = None, None
    elif data == "dp":
        replicate = seen.get("dp", 1) if "dp" in seen else 1
        if "dp" in seen and seen["dp"] is None:
            replicate = None
    else:
        shard = seen[data]
        replicate = seen.get("dp", 1)
        if "dp" in seen and seen["dp"] is None:
            replicate = None
        if shard is None and replicate is None:
            raise EstimatorInputError(FIELD, f"give a degree to {data} or to dp")
    return LayoutText(
        text=raw,
        data=data,
        shard=shard,
        replicate=replicate,
        tp=seen.get("tp") or 1,
        sp="sp" in seen,
        cp=seen.get("cp") or 1,
        pp=seen.get("pp") or 1,
        ep=seen.get("ep") or 1,
        hsdp=hsdp,
    )


def resolve(spec_text: LayoutText, gpus: int, gpus_per_node: int | None = None) -> Layout:
    """Degrees for `gpus` cards: the one data-parallel degree left open takes what the others
    leave; the product must equal `gpus` (error naming setup.parallel otherwise). `hsdp`
    shards over one node's GPUs (`gpus_per_node`, all GPUs when unknown) and replicates across
    nodes."""
    t = spec_text
    fixed = t.tp * t.cp * t.pp
    shard, replicate = t.shard, t.replicate
    if t.hsdp:
        per_node = min(gpus_per_node or gpus, gpus)
        shard = max(per_node // fixed, 1)
        replicate = None
    if shard is None or replicate is None:
        known = fixed * (shard or 1) * (replicate or 1)
        if gpus % known:
            raise EstimatorInputError(
                FIELD, f"{t.text}: {gpus} GPUs are not a multiple of the {known} the layout fixes"
            )
        rest = gpus // known
        shard, replicate = (rest, replicate or 1) if shard is None else (shard, rest)
    total = fixed * shard * replicate
    if total != gpus:
        raise EstimatorInputError(
            FIELD,
            f"{t.text}: the degrees multiply to {total} GPUs but the run has {gpus}; "
            "make the product equal the GPU count (leave one of dp/fsdp/zero without =N)",
        )
    if t.ep > 1 and (shard * replicate * t.cp) % t.ep:
        raise EstimatorInputError(
            FIELD,
            f"ep={t.ep} must divide the data-parallel x context-parallel ranks "
            f"({shard * replicate * t.cp})",
        )
    return Layout(
        data=t.data,
        shard=shard,
        replicate=replicate,
        tp=t.tp,
        sp=t.sp,
        cp=t.cp,
        pp=t.pp,
        ep=t.ep,
    )


def fixed_gpus(text: str) -> int | None:
    """The GPU count a layout names by itself (`fsdp=8,tp=2` -> 16), None when a degree is
    left open (`fsdp,tp=2`) or the layout is `hsdp`."""
    t = parse_parallel(text)
    if t.shard is None or t.replicate is None or t.hsdp:
        return None
    return t.shard * t.replicate * t.tp * t.cp * t.pp
