"""Which Linear layers LoRA adapts, and how many parameters the adapters add.

peft (`tuners/lora/model.py`, `utils/other.py`): a target name matches a module whose name ends
with it; `all-linear` means every `nn.Linear` except the output layer (lm_head). Each adapted
Linear gains `lora_A` (r x in) and `lora_B` (out x r): r * (in + out) parameters, no bias.
Expert banks (transformers v5 fuses experts into 3-D parameters, not nn.Linear) are not matched:
an assumption. peft 0.21 does adapt them under `all-linear` through its transformers
weight-conversion tables (rank multiplied by the number of experts), so for MoE models the
adapter count here is a lower bound (checked against peft for dense models in tests).
"""

from __future__ import annotations

from estimator.errors import EstimatorInputError
from estimator.setup import TrainingSetup
from estimator.spec import Linear, ModelSpec


def _matches(linear: Linear, target: str) -> bool:
    return (
        linear.name == target
        or linear.name.endswith("." + target)
        or ("." in target and target.endswith(linear.name))
    )


def lora_targets(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The Linear kinds that get adapters. Unknown target names are an error naming them."""
    if not spec.geometry_known:
        raise EstimatorInputError(
            "setup.lora_targets", "LoRA needs the model's geometry: give a config.json or preset"
        )
    candidates = [lin for lin in spec.linears if lin.group not in ("head",) and lin.experts == 1]
    if "all-linear" in setup.lora_targets:
        return candidates
    chosen: list[Linear] = []
    for target in setup.lora_targets:
        hits = [lin for lin in candidates if _matches(lin, target)]
        if not hits and not any(_matches(lin, target) for lin in spec.linears):
            raise EstimatorInputError(
                "setup.lora_targets",
                f"{target!r} matches no Linear of {spec.model_type}; "
                f"known: {', '.join(spec.linear_names)}",
            )
        chosen += [lin for lin in hits if lin not in chosen]
    return chosen


def lora_rank_check(spec: ModelSpec, setup: TrainingSetup, targets: list[Linear]) -> None:
    """A rank above min(in, out) of every target adds parameters without adding rank."""
    if targets and all(setup.lora_rank > min(t.in_features, t.out_features) for t in targets):
        smallest = max(min(t.in_features, t.out_features) for t in targets)
        raise EstimatorInputError(
            "setup.lora_rank", f"rank {setup.lora_rank} exceeds every target's size ({smallest})"
        )


def lora_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Trainable adapter parameters: sum over targets of count * r * (in + out)."""
    targets = lora_targets(spec, setup)
    lora_rank_check(spec, setup, targets)
    r = setup.lora_rank
    return sum(t.count * r * (t.in_features + t.out_features) for t in targets)
