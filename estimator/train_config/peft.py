"""A PEFT `adapter_config.json` (a `LoraConfig` as `save_pretrained` writes it).

Field names and defaults read from peft 0.22.0, `src/peft/tuners/lora/config.py`: `r` (default
8, line 708), `target_modules` (709: a list of module names, or a string peft matches as a
regular expression over whole module names), `exclude_modules` (724), `lora_alpha` (default 8,
728), `lora_dropout` (default 0.0, 729), `bias` (734: none | all | lora_only), `use_rslora`
(737), `modules_to_save` (748), `layers_to_transform` / `layers_pattern` (807-814),
`rank_pattern` / `alpha_pattern` (822-831), `trainable_token_indices` (866), `use_dora` (930),
`layer_replication` (1007), `lora_bias` (1029); `target_parameters` (1039) naming MoE expert banks
is read (estimator.lora BANK_TARGETS), other parameters reported; and from
`src/peft/config.py`: `peft_type` (109), `task_type` (108), `base_model_name_or_path`,
`revision`, `inference_mode`. How peft applies `exclude_modules` and `layers_to_transform`:
`tuners/tuners_utils.py` `check_target_module_exists` (2481-2556).

An adapter config says nothing about the base's quantization (QLoRA is the base loaded in 4 bits
plus a LoRA adapter), the optimizer, lengths or batches: those come from the command line or a
training config, and an adapter config only fills what they do not state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.lora import PEFT_ALL_LINEAR, REGEX, peft_target_list
from estimator.train_config.result import TrainConfigMapping
from estimator.train_config.vocab import add_bank_targets, trains_embeddings, with_revision

# peft's LoraConfig defaults where a saved config leaves a field out
PEFT_DEFAULTS = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0}
# read and without effect on the memory of training (initialisation, scaling, bookkeeping)
NO_MEMORY_EFFECT = (
    "task_type",
    "revision",
    "inference_mode",
    "fan_in_fan_out",
    "use_rslora",
    "init_lora_weights",
    "layers_pattern",
    "alpha_pattern",
    "auto_mapping",
    "peft_version",
    "megatron_core",
    "runtime_config",
    "qalora_group_size",  # read with use_qalora (NOT_MODELLED)
)
# set to anything but their default, these change what trains: not modelled, said so
NOT_MODELLED = {
    "exclude_modules": "excluded module paths or a pattern are not modelled here (plain names "
    "against a list of plain-name targets are): counted as adapted (an overestimate of the "
    "adapters' bytes)",
    "layers_to_transform": "adapters on those layers only; counted on every layer (an "
    "overestimate of the adapters' bytes)",
    "rank_pattern": "per-module ranks are not modelled: every adapter is counted at `r`",
    "use_dora": "DoRA's magnitude vectors and activations are not modelled",
    "trainable_token_indices": "the trained embedding rows are not modelled",
    "layer_replication": "replicated layers are not modelled",
    "lora_bias": "lora_B's bias is not modelled",
    "use_qalora": "QALoRA is not modelled",
}


def read_peft(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    m = TrainConfigMapping("peft")
    kind = m.get(data, "peft_type")
    if kind is not None and str(kind).upper() != "LORA":
        raise EstimatorInputError(
            "train_config.peft_type", f"{kind!r}: only LORA adapters are modelled"
        )
    m.set("method", "lora", "peft_type" if kind is not None else "(a PEFT adapter config)")
    _base_model(m, data, base_dir)
    for field, default in PEFT_DEFAULTS.items():
        value = m.get(data, field)
        name = "lora_rank" if field == "r" else field
        if value is None:
            m.set(name, default, f"(peft's default {field}, tuners/lora/config.py)")
        else:
            m.set(name, value, field)
    targets = peft_target_list(m.get(data, "target_modules"))
    kept = None  # the targets less `exclude_modules`, where that is exact
    if targets is None:
        m.ignore(
            "target_modules",
            "unset: peft takes the model type's defaults (utils/constants.py); not read, "
            "the request's targets apply",
        )
    else:
        kept = _without_excluded(targets, m.get(data, "exclude_modules"))
        m.set(
            "lora_targets",
            targets if kept is None else kept,
            "target_modules" if kept is None else "target_modules, exclude_modules",
        )
    add_bank_targets(m, m.get(data, "target_parameters"), "target_parameters")
    m.set("train_embeddings", trains_embeddings(m.get(data, "modules_to_save")), "modules_to_save")
    bias = m.get(data, "bias")
    if bias not in (None, "none"):
        m.ignore("bias", f"{bias!r} trains biases, which are not modelled")
    for key, reason in NOT_MODELLED.items():
        if key == "exclude_modules" and kept is not None:
            continue  # applied to the targets
        if m.get(data, key) not in (None, False, "", [], {}):
            m.ignore(key, reason)
    for key in NO_MEMORY_EFFECT:
        m.get(data, key)
    m.warn_unread(data)
    return m


def _without_excluded(targets: list[str], exclude: object) -> list[str] | None:
    """The targets less `exclude_modules` where peft's rule (tuners_utils.py:2350-2356: a module
    is excluded when its name is in the list or ends with `.<entry>`) removes whole kinds: plain
    names (no dot) against a list of plain-name targets, so every layer loses the same modules.
    None for anything else, left to NOT_MODELLED (reported, counted as adapted)."""
    plain = (
        isinstance(exclude, list)
        and bool(exclude)
        and all(isinstance(e, str) and e and "." not in e for e in exclude)
    )
    if not plain or any("." in t or t.startswith(REGEX) or t in PEFT_ALL_LINEAR for t in targets):
        return None
    assert isinstance(exclude, list)
    kept = [t for t in targets if t not in exclude]
    if not kept:
        raise EstimatorInputError(
            "train_config.exclude_modules", "excludes every target module: peft adapts nothing"
        )
    return kept


def _base_model(m: TrainConfigMapping, data: dict[str, Any], base_dir: Path | None) -> None:
    name = m.get(data, "base_model_name_or_path")
    if not name:
        return
    try:
        m.model = with_revision(str(name), m.get(data, "revision"), base_dir)
    except EstimatorInputError as err:  # a path of the machine that trained it, say
        m.ignore("base_model_name_or_path", err.message)
        return
    m.origin["model"] = "base_model_name_or_path"
