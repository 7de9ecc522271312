"""Which Linear layers LoRA adapts, and how many parameters the adapters add.

peft (`tuners/lora/model.py`, `utils/other.py`): a target name matches a module whose name ends
with it; `all-linear` means every `nn.Linear` except the output layer (lm_head). Each adapted
Linear gains `lora_A` (r x in) and `lora_B` (out x r): r * (in + out) parameters, no bias.
Expert banks (transformers v5 fuses experts into 3-D parameters, not nn.Linear) are adapted
under `all-linear`, as peft 0.22 does through its weight-conversion tables, or when named as
peft's `target_parameters` (`experts.gate_up_proj`, `experts.down_proj`, or `experts` for
both: `BANK_TARGETS`), which wraps each named parameter in a ParamWrapper of rank r.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

from estimator.errors import EstimatorInputError
from estimator.memo import Memo
from estimator.spec import LAYER_LINEAR, MLP_DENSE, MLP_MOE, Linear, ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup


_REGEX_HITS: Memo[list[Linear]] = Memo()  # per (spec, target): matched once, not per use

# A target written `re:PATTERN` is peft's string `target_modules`: a regular expression that
# must match a module's whole name (peft 5d602fdbf src/peft/tuners/tuners_utils.py:2326-2327
# check_target_module_exists -> src/peft/utils/other.py:1516-1521 `re.fullmatch`), e.g.
# `model.layers.0.self_attn.q_proj`. axolotl passes a string `lora_target_modules` to
# LoraConfig as it is (axolotl 067b021c8 src/axolotl/loaders/adapter.py:171-190).
REGEX = "re:"
# the longest a pattern may search (the `regex` module's timeout): a hostile pattern with
# nested quantifiers is refused instead of hanging the service
REGEX_SECONDS = 0.5


def split_targets(text: str) -> list[str]:
    """Targets as typed on the command line or the web form: names separated by commas or new
    lines; a text that starts with `re:` is one pattern, its commas (`{1,3}`) included."""
    text = text.strip()
    if text.startswith(REGEX):
        return [text]
    return [t.strip() for t in text.replace("\n", ",").split(",") if t.strip()]


# peft's `all-linear` wildcard (peft 0.22.0 utils/constants.py:405, compared lowercased at
# tuners/tuners_utils.py:2585), and the underscore spelling trainfit takes for it too
PEFT_ALL_LINEAR = ("all-linear", "all_linear")


# LoraConfig(target_modules=None): peft takes the targets of the model's config.json
# `model_type` from TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING and raises "Please
# specify `target_modules` in `peft_config`" for a type it lacks (peft 0.22.0
# tuners/tuners_utils.py:421-424, tuners/lora/model.py:230). The decoder entries of that table
# (utils/constants.py:67-108), a string entry as a `re:` pattern. `peft-default` asks for them.
PEFT_DEFAULT = "peft-default"
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "gpt2": ("c_attn",),
    "bloom": ("query_key_value",),
    "opt": ("q_proj", "v_proj"),
    "gptj": ("q_proj", "v_proj"),
    "gpt_neox": ("query_key_value",),
    "gpt_neo": ("q_proj", "v_proj"),
    "llama": ("q_proj", "v_proj"),
    "llama4": ("q_proj", "v_proj"),
    "gpt_bigcode": ("c_attn",),
    "mpt": ("Wqkv",),
    "falcon": ("query_key_value",),
    "codegen": ("qkv_proj",),
    "mistral": ("q_proj", "v_proj"),
    "mixtral": ("q_proj", "v_proj"),
    "stablelm": ("q_proj", "v_proj"),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gemma": ("q_proj", "v_proj"),
    "gemma2": ("q_proj", "v_proj"),
    "gemma3_text": ("q_proj", "v_proj"),
    "gemma4": (r"re:.*language_model\..*\.(q_proj|v_proj)",),
    "qwen2": ("q_proj", "v_proj"),
    "qwen3": ("q_proj", "v_proj"),
    "nemotron_h": ("q_proj", "k_proj", "v_proj", "o_proj"),
}


def peft_model_type(spec: ModelSpec) -> str:
    """The `model_type` peft looks its default targets up by: the config's own (a composite's,
    not its text model's)."""
    return spec.config_model_type or spec.model_type


def peft_default_targets(spec: ModelSpec) -> list[str]:
    """The targets peft picks for `spec` when none are given (`PEFT_DEFAULT_TARGETS`), looked
    up by `peft_model_type`."""
    model_type = peft_model_type(spec)
    if spec.peft_fused_experts:
        # transformers v5's MoE remap runs first and turns None into an empty set, so the
        # table is never read (peft 0.22.0 tuners_utils.py:877-893, 421;
        # utils/transformers_weight_conversion.py:446-447) and peft raises
        # NoMatchingPeftModuleError (tuners_utils.py:1107-1111)
        raise EstimatorInputError(
            "setup.lora_targets",
            f"peft with transformers v5 finds no default targets for {model_type!r}, whose "
            "experts it remaps (NoMatchingPeftModuleError): name them",
        )
    targets = PEFT_DEFAULT_TARGETS.get(model_type)
    if targets is None:
        raise EstimatorInputError(
            "setup.lora_targets",
            f"peft has no default target modules for model_type {model_type!r} (it raises "
            "'Please specify `target_modules`', tuners/tuners_utils.py:410-413): name them",
        )
    return list(targets)


def peft_target_list(target_modules: object) -> list[str] | None:
    """peft's `target_modules` (an adapter_config.json, a LoraConfig) as trainfit targets: a
    list names modules; a string other than `all-linear` is a regex (`re:`)."""
    if isinstance(target_modules, str):
        special = target_modules in PEFT_ALL_LINEAR
        return [target_modules if special else f"{REGEX}{target_modules}"]
    if isinstance(target_modules, list):
        return [str(t) for t in target_modules]
    return None


def _parent(spec: ModelSpec, linear: Linear) -> str:
    """The module holding `linear` inside a decoder layer, as transformers 5.25.0 names it
    (each checked against the model built on the meta device in
    tests/estimator/test_lora_regex.py)."""
    llama4 = spec.model_type.startswith("llama4")
    if "." in linear.name:  # gpt2's `attn.c_proj`, `mlp.c_proj`: the name carries it
        return ""
    if linear.group == "attention":
        return "attn" if spec.model_type == "gpt2" else "self_attn"
    if linear.group == "linear_attention":
        return "linear_attn"
    if linear.group == "shared_expert":
        if llama4:
            return "feed_forward.shared_expert"
        # DeepSeek-V3's block, which GLM-4.5 repeats, names them in the plural
        sigmoid = spec.moe is not None and spec.moe.router == "grouped_sigmoid"
        return "mlp.shared_experts" if sigmoid else "mlp.shared_expert"
    return "feed_forward" if llama4 else "mlp"


def _layer_indexes(spec: ModelSpec, linear: Linear) -> list[int]:
    """The decoder layers holding `linear`: attention kinds in the layers that are not linear
    attention, MLP kinds in dense layers, expert-side kinds in MoE layers."""
    layers = range(spec.layers or 0)
    if linear.group == "attention" and spec.layer_types:
        return [i for i in layers if spec.layer_types[i] != LAYER_LINEAR]
    if linear.group == "linear_attention":
        return [i for i in layers if spec.layer_types and spec.layer_types[i] == LAYER_LINEAR]
    if spec.mlp_types and linear.group in ("mlp", "shared_expert", "router", "experts"):
        wanted = MLP_DENSE if linear.group == "mlp" else MLP_MOE
        return [i for i in layers if spec.mlp_types[i] == wanted]
    return list(layers)


def module_names(spec: ModelSpec, linear: Linear) -> list[str]:
    """The full module name of each instance of `linear` (one per layer holding it), as
    `model.named_modules()` gives it: what peft's regex targets are matched against."""
    parent = _parent(spec, linear)
    leaf = f"{parent}.{linear.name}" if parent else linear.name
    return [f"{spec.layers_module}.{i}.{leaf}" for i in _layer_indexes(spec, linear)]


def _regex_targets(spec: ModelSpec, target: str, candidates: list[Linear]) -> list[Linear]:
    """The Linear kinds a `re:` target adapts: those whose every instance it matches. One it
    matches in some layers only is an error (adapters on part of the layers are not modelled),
    as is a pattern that matches no Linear."""
    import regex  # the `re` syntax, with a timeout

    pattern = target[len(REGEX) :]
    chosen = []
    deadline = time.monotonic() + REGEX_SECONDS  # for the whole target, all its names

    def matches(name: str) -> bool:
        left = max(deadline - time.monotonic(), 1e-3)
        return regex.fullmatch(pattern, name, timeout=left) is not None

    try:
        for lin in candidates:
            names = module_names(spec, lin)
            hits = sum(1 for n in names if matches(n))
            if hits and hits < len(names):
                raise EstimatorInputError(
                    "setup.lora_targets",
                    f"{target!r} matches {lin.name} in {hits} of its {len(names)} layers; "
                    "adapters on some layers only are not modelled",
                )
            if hits:
                chosen.append(lin)
    except TimeoutError:
        raise EstimatorInputError(
            "setup.lora_targets", f"{target!r}: the pattern takes too long to match"
        ) from None
    if not chosen:
        example = module_names(spec, candidates[0])[0] if candidates else "model.layers.0..."
        raise EstimatorInputError(
            "setup.lora_targets",
            f"{target!r} matches no Linear module of {spec.model_type} (peft matches the whole "
            f"module name, such as {example!r})",
        )
    return chosen


def _matches(linear: Linear, target: str) -> bool:
    return (
        linear.name == target
        or linear.name.endswith("." + target)
        or ("." in target and target.endswith(linear.name))
    )


def _has_expert_banks(spec: ModelSpec) -> bool:
    return any(lin.experts > 1 for lin in spec.linears)


# nn.Linear subclasses whose forward returns a tuple: peft wraps them as any Linear and its
# LoRA forward reads `result.dtype` of the base layer's output (peft 0.22.0
# tuners/lora/layer.py:1192), which fails on the first step. Llama 4's router
# (transformers 5.25.0 models/llama4/modeling_llama4.py:145-156 `Llama4Router(nn.Linear)`
# returns (router_scores, router_logits)); checked by building the model with
# target_modules="all-linear" and running one forward.
TUPLE_LINEARS = {"llama4_text": "router", "llama4": "router"}


def lora_targets(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The Linear kinds that get adapters; a setup that adapts a Linear peft cannot run
    (`TUPLE_LINEARS`) is an error naming the target list, one that adapts an expert bank with
    dropout (`expert_banks`) an error naming the dropout."""
    chosen = _lora_targets(spec, setup)
    if setup.lora_dropout and expert_banks(spec, setup):
        raise EstimatorInputError(
            "setup.lora_dropout",
            "these targets adapt the fused expert banks, which peft wraps in a ParamWrapper; "
            "it refuses lora_dropout != 0 (peft 0.22.0 tuners/lora/layer.py:2532-2535): use 0",
        )
    bad = TUPLE_LINEARS.get(spec.model_type)
    if bad and any(lin.name == bad for lin in chosen):
        raise EstimatorInputError(
            "setup.lora_targets",
            f"these targets adapt {spec.model_type}'s {bad!r}, an nn.Linear whose forward "
            "returns a tuple; peft's LoRA forward fails on it at the first step (peft 0.22.0 "
            "tuners/lora/layer.py:1192 `result.dtype`); name the projections instead, e.g. "
            + ",".join(_names_but(chosen, bad)),
        )
    return chosen


def runnable_targets(spec: ModelSpec, setup: TrainingSetup) -> TrainingSetup:
    """`setup` with all-linear spelled as the Linear names peft can adapt on this model (every
    one but a `TUPLE_LINEARS` entry); other setups unchanged."""
    bad = TUPLE_LINEARS.get(spec.model_type)
    if not bad or not setup.is_adapter or "all-linear" not in setup.lora_targets:
        return setup
    names = _names_but(_lora_targets(spec, setup), bad)
    return setup.model_copy(update={"lora_targets": names})


def _names_but(linears: list[Linear], name: str) -> list[str]:
    """The distinct Linear names of `linears`, in order, without `name`."""
    return list(dict.fromkeys(lin.name for lin in linears if lin.name != name))


def _lora_targets(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The Linear kinds that get adapters. Unknown target names are an error naming them.

    `all-linear` on an MoE model follows peft 0.22 with transformers v5: its weight-conversion
    tables turn the MLP names (gate_proj, up_proj, down_proj) into the fused expert
    parameters too (see `expert_lora_params`), but a name that matches nn.Linear modules stays
    a module target (peft 0.22.0 utils/transformers_weight_conversion.py:489-505), so dense-MLP
    and shared-expert Linears of those names keep their adapters, as do the routers. So do
    those MLP names in a target list or regex (`_remapped_names`: the banks they add). peft
    0.21 moved the names to the expert parameters only, leaving those Linears unadapted."""
    chosen = _lora_targets_before_remap(spec, setup)
    _remapped_names(spec, setup, chosen)  # peft's errors (gate_proj without up_proj)
    return chosen


def _lora_targets_before_remap(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The Linear kinds the targets name, before peft's MoE remap."""
    if not spec.geometry_known:
        raise EstimatorInputError(
            "setup.lora_targets", "LoRA needs the model's geometry: give a config.json or preset"
        )
    if setup.lora_targets == [PEFT_DEFAULT]:
        setup = setup.model_copy(update={"lora_targets": peft_default_targets(spec)})
    candidates = [lin for lin in spec.linears if lin.group not in ("head",) and lin.experts == 1]
    if "all-linear" in setup.lora_targets:
        if _has_expert_banks(spec) and spec.peft_fused_experts:
            # the router too, an nn.Linear no more: peft maps `gate` to its `gate.weight`
            # parameter (peft 0.22.0 utils/transformers_weight_conversion.py:473-481, 505)
            return candidates
        return [lin for lin in candidates if lin.nn_linear]
    chosen: list[Linear] = []
    banks_named = bool(bank_kinds(setup))
    if banks_named and not _has_expert_banks(spec):
        raise EstimatorInputError(
            "setup.lora_targets",
            f"{spec.model_type} has no fused expert banks for the target parameters "
            f"({', '.join(t for t in setup.lora_targets if t in BANK_TARGETS)})",
        )
    for target in setup.lora_targets:
        if target in BANK_TARGETS:
            continue  # a fused expert parameter, not a Linear (`expert_banks`)
        if target.startswith(REGEX):
            nn_linear = [lin for lin in candidates if lin.nn_linear]
            found = _REGEX_HITS.get(
                (spec,), target, partial(_regex_targets, spec, target, nn_linear)
            )
            chosen += [lin for lin in found if lin not in chosen]
            continue
        hits = [lin for lin in candidates if _matches(lin, target)]
        chosen += [lin for lin in hits if lin not in chosen]
    unmatched = unmatched_targets(spec, setup)
    if unmatched and len(unmatched) == len(setup.lora_targets):
        raise EstimatorInputError(
            "setup.lora_targets",
            f"{unmatched[0]!r} matches no Linear of {spec.model_type}; "
            f"known: {', '.join(spec.linear_names)}",
        )
    return chosen


def unmatched_targets(spec: ModelSpec, setup: TrainingSetup) -> list[str]:
    """Target names (not patterns, bank parameters or the all-linear / peft-default words)
    that match no Linear of the model. peft leaves such names out as long as another target
    matches, and raises only when none does (peft 0.22.0 tuners/tuners_utils.py:1100-1120):
    axolotl's GLM-4.7-Flash examples name q_proj, k_proj, v_proj and o_proj on an MLA model,
    where only o_proj exists. trainfit does the same and says which names it left out
    (`rows.model_summary` notes); all unmatched is an error naming the target list."""
    if "all-linear" in setup.lora_targets or setup.lora_targets == [PEFT_DEFAULT]:
        return []
    targets = tuple(setup.lora_targets)
    return list(_UNMATCHED.call((spec,), targets, _unmatched, spec, targets))


def _unmatched(spec: ModelSpec, targets: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(
        t
        for t in targets
        if t not in BANK_TARGETS
        and not t.startswith(REGEX)
        and not any(_matches(lin, t) for lin in spec.linears)
    )


_UNMATCHED: Memo[tuple[str, ...]] = Memo()  # per (spec, targets): once, not per estimate


MLP_NAMES = ("gate_proj", "up_proj", "down_proj")
# peft's `target_parameters` on transformers v5's fused expert parameters (peft 0.22.0
# tuners/lora/config.py:683-694, tuners_utils.py:1225 `_inject_parameters`: a parameter whose
# name ends with the target is wrapped), as axolotl's `lora_target_parameters` spells them:
# the bank kinds each token adapts
BANK_TARGETS = {
    "experts": ("gate_up", "down"),
    "experts.gate_up_proj": ("gate_up",),
    "experts.down_proj": ("down",),
    "mlp.experts.gate_up_proj": ("gate_up",),
    "mlp.experts.down_proj": ("down",),
}
_BANK_OF = {"gate_proj": "gate_up", "up_proj": "gate_up", "down_proj": "down"}


def bank_kinds(setup: TrainingSetup) -> set[str]:
    """The fused expert parameters named as `target_parameters` (`BANK_TARGETS`)."""
    return {kind for t in setup.lora_targets for kind in BANK_TARGETS.get(t, ())}


def remaps_mlp_names(spec: ModelSpec) -> bool:
    """Whether peft turns MLP target names into this model's fused expert parameters: peft
    0.21.2 utils/transformers_weight_conversion.py:332-352 maps gate_proj / up_proj /
    down_proj to gate_up_proj / down_proj for every model type transformers 5.25.0
    conversion_mapping.py gives the qwen2_moe pattern (every `peft_fused_experts` family here
    but Mixtral, whose mapped names are its v4 w1 / w3 / w2)."""
    return spec.peft_fused_experts and spec.model_type != "mixtral"


def _remapped_names(spec: ModelSpec, setup: TrainingSetup, chosen: list[Linear]) -> set[str]:
    """The MLP names among the targets that peft also turns into the expert parameters (peft
    0.22.0 utils/transformers_weight_conversion.py:464-510): named bare, or the leaf names of
    the modules a regex matched (`_resolve_string_target_modules`, :356-408; `chosen` holds
    them). Such a name adapts the fused expert bank and, where
    nn.Linear modules carry it (dense MLPs, shared experts), those too (:489-505); naming
    gate_proj without up_proj (fused into one parameter) is peft's ValueError (:511-519)."""
    if not remaps_mlp_names(spec) or "all-linear" in setup.lora_targets:
        return set()
    # a bare name: its mapped name (gate_up_proj, down_proj) is a suffix of the experts'
    # parameter; a dotted one (`mlp.down_proj`) is not (`mlp.experts.down_proj`), so where
    # Linears of that name exist it adapts them alone (:489-505); a regex counts by the leaf
    # names of what it matched
    named = {t for t in setup.lora_targets if t in MLP_NAMES}
    if any(t.startswith(REGEX) for t in setup.lora_targets):
        named |= {lin.name for lin in chosen if lin.name in MLP_NAMES}
    if len(named & {"gate_proj", "up_proj"}) == 1:
        (one,) = named & {"gate_proj", "up_proj"}
        other = "up_proj" if one == "gate_proj" else "gate_proj"
        raise EstimatorInputError(
            "setup.lora_targets",
            f"peft cannot adapt {one} without {other} on {spec.model_type}: it turns both into "
            "the experts' fused gate_up_proj (peft 0.22.0 "
            "utils/transformers_weight_conversion.py:511-519): name both or neither",
        )
    return named


def expert_banks(spec: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """Expert banks adapted: every bank under `all-linear` (see lora_targets), the named ones
    under `target_parameters` tokens (their Linear kinds: gate_up is gate_proj + up_proj),
    and those whose MLP names peft remaps (`remaps_mlp_names`)."""
    if "all-linear" in setup.lora_targets:
        if not spec.peft_fused_experts:
            return []
        return [lin for lin in spec.linears if lin.experts > 1]
    kinds = bank_kinds(setup)
    if remaps_mlp_names(spec):
        kinds |= {_BANK_OF[name] for name in _mlp_names_targeted(spec, setup)}
    return [lin for lin in spec.linears if lin.experts > 1 and _BANK_OF.get(lin.name) in kinds]


def _mlp_names_targeted(spec: ModelSpec, setup: TrainingSetup) -> frozenset[str]:
    """`_remapped_names` of the setup's targets (regex hits included): empty where peft
    remaps nothing, else resolved once per (spec, targets) (`expert_banks` and
    `expert_adapter_tensors` ask on every Context and adapter count)."""
    if not remaps_mlp_names(spec) or "all-linear" in setup.lora_targets:
        return frozenset()
    targets = tuple(setup.lora_targets)
    return _TARGETED.call((spec,), targets, _names_targeted, spec, setup)


def _names_targeted(spec: ModelSpec, setup: TrainingSetup) -> frozenset[str]:
    return frozenset(_remapped_names(spec, setup, _lora_targets_before_remap(spec, setup)))


_TARGETED: Memo[frozenset[str]] = Memo()


def expert_adapter_tensors(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[int, int, int]]:
    """(lora_A values, lora_B values, instances) of each expert parameter peft's ParamWrapper
    adapts. A fused 3-D parameter (E, out, in) gets lora_A (r*E, in) and lora_B (out, r*E);
    transformers' gate_up_proj is one parameter of out = 2 x intermediate (the gate_proj and
    up_proj Linear kinds of the spec), counted once, by gate_proj. Under `all-linear` its rank
    is doubled (peft's rank_pattern for gate_up_proj); named as a target parameter it has rank
    r. Per sparse layer: gate_up 2rE(h + 2m) (all-linear) or rE(h + 2m), down rE(m + h).
    Checked against peft in tests/estimator/test_lora.py and test_expert_bank_targets.py."""
    r = setup.lora_rank
    banks = expert_banks(spec, setup)
    gated = any(lin.name == "gate_proj" for lin in banks)
    # peft's rank_pattern doubles the fused gate_up_proj's rank when both of its names were
    # targets: all-linear, or gate_proj and up_proj remapped (peft 0.22.0
    # utils/transformers_weight_conversion.py:521-524)
    both = "all-linear" in setup.lora_targets or {"gate_proj", "up_proj"} <= _mlp_names_targeted(
        spec, setup
    )
    gate_up_rank = 2 * r if both else r
    tensors = []
    for lin in banks:
        fused = gated and lin.name in ("gate_proj", "up_proj")
        if fused and lin.name == "up_proj":
            continue  # its half of gate_up_proj, counted with gate_proj
        rank, out = (gate_up_rank, 2 * lin.out_features) if fused else (r, lin.out_features)
        tensors.append((rank * lin.experts * lin.in_features, rank * lin.experts * out, lin.count))
    return tensors


def expert_lora_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The adapter parameters on the expert banks (`expert_adapter_tensors`)."""
    return sum((a + b) * count for a, b, count in expert_adapter_tensors(spec, setup))


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
