"""Which Linear layers LoRA adapts, and how many parameters the adapters add.

peft (`tuners/lora/model.py`, `utils/other.py`): a target name matches a module whose name ends
with it; `all-linear` means every `nn.Linear` except the output layer (lm_head). Each adapted
Linear gains `lora_A` (r x in) and `lora_B` (out x r): r * (in + out) parameters, no bias.
Expert banks (transformers v5 fuses experts into 3-D parameters, not nn.Linear) are adapted
only under `all-linear`, as peft 0.21 does through its weight-conversion tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from estimator.errors import EstimatorInputError
from estimator.spec import Linear, ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


def _matches(linear: Linear, target: str) -> bool:
    return (
        linear.name == target
        or linear.name.endswith("." + target)
        or ("." in target and target.endswith(linear.name))
    )


def _has_expert_banks(spec: ModelSpec) -> bool:
    return any(lin.experts > 1 for lin in spec.linears)


def lora_targets(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The Linear kinds that get adapters. Unknown target names are an error naming them.

    `all-linear` on an MoE model follows peft 0.21 with transformers v5: its weight-conversion
    tables turn the MLP names (gate_proj, up_proj, down_proj) into the fused expert parameters,
    so dense-MLP and shared-expert Linears of those names are not adapted, the expert banks
    are (see `expert_lora_params`), and the routers are."""
    if not spec.geometry_known:
        raise EstimatorInputError(
            "setup.lora_targets", "LoRA needs the model's geometry: give a config.json or preset"
        )
    candidates = [lin for lin in spec.linears if lin.group not in ("head",) and lin.experts == 1]
    if "all-linear" in setup.lora_targets:
        if _has_expert_banks(spec) and spec.peft_fused_experts:
            return [lin for lin in candidates if lin.name not in MLP_NAMES]
        return [lin for lin in candidates if lin.nn_linear]
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


MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def expert_banks(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """Expert banks adapted (only under `all-linear`, see lora_targets)."""
    if "all-linear" not in setup.lora_targets or not spec.peft_fused_experts:
        return []
    return [lin for lin in spec.linears if lin.experts > 1]


def expert_lora_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """peft's ParamWrapper on a fused 3-D expert parameter (E, out, in): lora_A (r*E, in) and
    lora_B (out, r*E); transformers' gate_up_proj is one parameter of out = 2 x intermediate
    with the rank doubled (peft's rank_pattern for gate_up_proj). Per sparse layer:
    gate_up 2rE(h + 2m), down rE(m + h). Checked against peft in tests/estimator/test_lora.py."""
    r = setup.lora_rank
    total = 0
    for lin in expert_banks(spec, setup):
        e = lin.experts
        if lin.name in ("gate_proj", "up_proj"):  # half of the fused gate_up_proj each
            total += lin.count * r * e * (lin.in_features + 2 * lin.out_features)
        else:
            total += lin.count * r * e * (lin.in_features + lin.out_features)
    return total


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
    dense = sum(t.count * r * (t.in_features + t.out_features) for t in targets)
    return dense + expert_lora_params(spec, setup)
