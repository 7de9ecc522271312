"""The Python API for notebooks: `trainfit.estimate(...)` returns a `Plan` (the estimate
document, with `to_frame()` for pandas), `trainfit.sweep(...)` a DataFrame of a vectorised grid.

    import trainfit
    plan = trainfit.estimate("llama-3.1-8b", gpus=["h100-80gb", "h200"], seq_lens=[4096, 8192],
                             method="lora", lora_rank=16)
    plan.to_frame()[["seq_len", "gpu", "verdict", "peak_gib", "usd"]]

Everything is computed by `estimator.document`, the same path as the CLI and the REST service;
this module only builds the request and shapes the result. pandas is needed for the frames
(`pip install pandas`), not for `estimate()` itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

GIB = 2**30
ModelArg = str | Path | Mapping[str, Any] | float | int


def _model_input(model: ModelArg, name: str | None) -> dict[str, Any]:
    """A preset id, a Hub id `ORG/NAME[@revision]`, a path to a config.json (or its folder), a
    config dict, or a parameter count (strings are classified by `estimator.hub.model_source`,
    as `--model` is)."""
    from estimator.hub import model_source

    out: dict[str, Any]
    if isinstance(model, bool):
        raise TypeError("model: expected a preset id, a config path or dict, or a parameter count")
    if isinstance(model, int | float):
        out = {"params": float(model)}
    elif isinstance(model, Mapping):
        out = {"config": dict(model)}
    else:
        source = model_source(str(model))
        if "file" in source:
            out = {"config": json.loads(Path(source["file"]).read_text(encoding="utf-8"))}
        else:
            out = dict(source)
    if name:
        out["name"] = name
    return out


def _listed(value: str | int | float | Iterable[Any]) -> list[Any]:
    return [value] if isinstance(value, str | int | float) else list(value)


@dataclass(frozen=True)
class Plan:
    """An estimate document (`doc`, JSON-ready: bytes, seconds, USD) and views of it."""

    doc: dict[str, Any]

    def to_frame(self) -> pd.DataFrame:
        """One row per (sequence length, setting) x GPU option: verdict, peak, usable and
        margin in bytes and GiB, every memory component in bytes and GiB, step time,
        tokens/s, hours and USD where known."""
        import pandas as pd

        records = []
        for row in self.doc["rows"]:
            for option, fit in row["fit"].items():
                components = fit.get("components") or row["components"]
                time, cost = fit.get("time") or {}, fit.get("cost") or {}
                rec: dict[str, Any] = {
                    "seq_len": row["seq_len"],
                    "batch": row["batch"],
                    "checkpointing": row["checkpointing"],
                    "loss": row["loss"],
                    "gpu": option,
                    "devices": fit["devices"],
                    "verdict": fit["verdict"],
                }
                for key in ("peak", "usable", "margin", "capacity"):
                    value = fit[f"{key}_bytes"]
                    rec[f"{key}_bytes"] = value
                    rec[f"{key}_gib"] = None if value is None else value / GIB
                for name, value in components.items():
                    rec[f"{name}_bytes"] = value
                    rec[f"{name}_gib"] = None if value is None else value / GIB
                rec["step_seconds"] = time.get("step_seconds")
                rec["tokens_per_second"] = time.get("tokens_per_second")
                rec["wall_hours"] = time.get("wall_hours")
                rec["gpu_hours"] = time.get("gpu_hours")
                rec["usd"] = cost.get("usd")
                records.append(rec)
        return pd.DataFrame.from_records(records)

    def to_markdown(self) -> str:
        from estimator.formats import render_markdown

        return render_markdown(self.doc)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()


ConfigPaths = str | Path | Sequence[str | Path]
DEFAULT_SEQ_LENS = (4096,)


def estimate(
    model: ModelArg | None = None,
    *,
    gpus: str | Sequence[str] = ("a100-80gb", "h100-80gb", "h200"),
    seq_lens: int | Sequence[int] | None = None,
    train_config: ConfigPaths | None = None,
    profile: str = "default",
    usable_fraction: float = 0.92,
    name: str | None = None,
    run: Mapping[str, Any] | None = None,
    **setup: Any,
) -> Plan:
    """Estimate memory, time and cost of training `model` on each GPU option at each length
    (default 4096, or the training config's).

    `setup` keywords are `TrainingSetup` fields (`method="lora"`, `lora_rank=16`,
    `optimizer="adamw-8bit"`, `checkpointing="offload"`, ...); `train_config` is an axolotl /
    LLaMA-Factory / torchtune / TRL file (or a list: + a DeepSpeed JSON or accelerate config),
    whose values come under the keywords given here, as on the command line; what it could not
    honour is in `plan.doc["setup"]["ignored"]`. `run` takes the request's tokens/cost fields
    (`{"tokens": 6.4e6, "prices": {"h200": 5.0}}`). Bad input raises
    `pydantic.ValidationError` or `estimator.EstimatorInputError`, naming the field."""
    from estimator.document import estimate_document
    from estimator.request import EstimateRequest

    body: dict[str, Any] = {
        "setup": setup,
        "gpus": _listed(gpus),
        "usable_fraction": usable_fraction,
        "profile": profile,
        **dict(run or {}),
    }
    if model is not None:
        body["model"] = _model_input(model, name)
    if seq_lens is not None:
        body["seq_lens"] = _listed(seq_lens)
    body, report = _with_train_config(body, train_config, name)
    body.setdefault("seq_lens", list(DEFAULT_SEQ_LENS))
    doc = estimate_document(EstimateRequest.model_validate(body))
    if report is not None:
        doc.setdefault("setup", {})["ignored"] = report["ignored"]
        doc["train_config"] = report
    return Plan(doc)


def _with_train_config(
    body: dict[str, Any], paths: ConfigPaths | None, name: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The body with a training config's values under it (estimator.train_config.body) and the
    report of what was read and ignored; a config naming a local model file reads it here."""
    if paths is None:
        return body, None
    from estimator.train_config.body import apply_to_body
    from estimator.train_config.load import read_train_configs

    mapping = read_train_configs([paths] if isinstance(paths, str | Path) else list(paths))
    if "model" not in body and mapping.model is not None:
        body = {**body, "model": _model_input(next(iter(mapping.model.values())), name)}
    merged = apply_to_body(body, mapping)
    report: dict[str, Any] = merged.pop("train_config")
    return merged, report


def sweep(
    model: ModelArg,
    *,
    seq_lens: Sequence[int],
    batches: Sequence[int] = (1,),
    gpus: str | Sequence[str] = ("a100-80gb", "h100-80gb", "h200"),
    setups: Sequence[Mapping[str, Any]] = ({},),
    profile: str = "default",
    usable_fraction: float = 0.92,
) -> pd.DataFrame:
    """The vectorised memory sweep (`estimator.sweep`) as a DataFrame: one row per setting x
    sequence length x micro-batch x GPU option, with the peak per device and the verdict."""
    import numpy as np
    import pandas as pd

    from estimator.fit import VERDICTS
    from estimator.gpu_options import parse_gpu_options
    from estimator.model_source import resolve_model
    from estimator.profile import load_profile
    from estimator.request import ModelInput
    from estimator.setup import TrainingSetup
    from estimator.sweep import sweep as run_sweep

    spec = resolve_model(ModelInput.model_validate(_model_input(model, None)))
    options = parse_gpu_options(_listed(gpus))
    assumptions = load_profile(profile)
    caps = [option.gpu.capacity_bytes for option in options]
    frames = []
    for fields in setups:
        setup = TrainingSetup.model_validate(dict(fields))
        result = run_sweep(spec, setup, seq_lens, batches, caps, assumptions, usable_fraction)
        seq, batch, gpu = np.meshgrid(
            result.seq_lens, result.batches, np.arange(len(options)), indexing="ij"
        )
        peak = result.peak_on_card
        frame = pd.DataFrame(
            {
                "seq_len": seq.reshape(-1).astype("int64"),
                "batch": batch.reshape(-1).astype("int64"),
                "gpu": [options[i].option for i in gpu.reshape(-1)],
                "peak_bytes": np.ceil(peak.reshape(-1)).astype("int64"),
                "peak_gib": peak.reshape(-1) / GIB,
                "verdict": [VERDICTS[int(c)] for c in result.verdict.reshape(-1)],
            }
        )
        for key, value in setup.model_dump().items():
            if isinstance(value, str | int | float) and key not in frame:
                frame.insert(0, key, value)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


__all__ = ["Plan", "estimate", "sweep"]
