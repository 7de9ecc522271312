"""A training config's values merged under a REST request body (`POST /v1/check`,
`/v1/estimate` with `train_config`): what the body states itself wins."""

from __future__ import annotations

from typing import Any

from estimator.train_config.result import Ignored, TrainConfigMapping, split_supported


def apply_to_body(body: dict[str, Any], mapping: TrainConfigMapping) -> dict[str, Any]:
    """REST: a request body (`POST /v1/check`, `/v1/estimate`) with a training config's values
    under what the body states itself (fields in the body win). Returns a new body with the
    report under `train_config` for the caller to pop before validation."""
    from estimator.setup import TrainingSetup

    accepted, rejected = split_supported(mapping.setup, TrainingSetup.model_fields)
    out = dict(body)
    out["setup"] = {**accepted, **dict(body.get("setup") or {})}
    if "model" not in body and mapping.model:
        if "file" in mapping.model:
            rejected.append(Ignored("model", "a local path is not read by the service"))
        else:
            out["model"] = dict(mapping.model)
    if "seq_lens" not in body and mapping.seq_lens:
        out["seq_lens"] = list(mapping.seq_lens)
    report = mapping.as_dict()
    report["ignored"] = report["ignored"] + [i.as_dict() for i in rejected]
    out["train_config"] = report
    return out


def merge_train_config(data: Any) -> tuple[Any, dict[str, Any] | None]:
    """A request body with `train_config: {"text": ..., "format": ...}`: the body with the
    config's values under it (`apply_to_body`) and the report (what was read, what was ignored
    and why). A body without one comes back unchanged with no report."""
    if not isinstance(data, dict) or data.get("train_config") is None:
        return data, None
    from estimator.errors import EstimatorInputError
    from estimator.train_config.load import read_train_config_text

    raw = data["train_config"]
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        raise EstimatorInputError("train_config.text", "give the config file's text")
    if len(raw["text"]) > MAX_TEXT:
        raise EstimatorInputError("train_config.text", f"longer than {MAX_TEXT} characters")
    fmt = raw.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise EstimatorInputError("train_config.format", "a format name, e.g. axolotl")
    unknown = sorted(set(raw) - {"text", "format"})
    if unknown:
        raise EstimatorInputError(f"train_config.{unknown[0]}", "unknown field")
    body = {k: v for k, v in data.items() if k != "train_config"}
    merged = apply_to_body(body, read_train_config_text(raw["text"], fmt))
    report = merged.pop("train_config")
    return merged, report


MAX_TEXT = 256 * 1024
