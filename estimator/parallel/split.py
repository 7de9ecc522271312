"""How tensor, pipeline, expert and context parallelism split one replica of the model over its
GPUs: the parameters each device holds, and the factors on the activations and logits.

Parameters (per device, before data-parallel sharding):
- tp divides every weight matrix and the embedding / lm_head (Megatron-LM
  megatron/core/tensor_parallel/layers.py: ColumnParallelLinear, RowParallelLinear,
  VocabParallelEmbedding); norms are replicated (too small to count).
- pp gives each stage ceil(L / pp) decoder layers, the embedding to the first stage and the
  lm_head to the last (Megatron `get_num_layers_to_build`; Narayanan et al. 2021).
- ep divides each expert bank over ep ranks (Megatron moe/experts.py: num_local_experts =
  num_moe_experts / expert_model_parallel_size); expert weights are also split by tp
  (expert_tensor_parallel_size defaults to tp).
Activations, per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2; s sequence, b micro-batch, h hidden, a heads, t = tp):
    no parallelism   s*b*h*(34 + 5*a*s/h)
    tensor parallel  s*b*h*(10 + 24/t + 5*a*s/(h*t))
    tensor + seq.    s*b*h*(34/t + 5*a*s/(h*t))
The 5*a*s/h term is the attention score / softmax / dropout storage; flash attention does not
keep it, so it is counted only for eager attention. A checkpointed layer's saved input (2*s*b*h
bytes) is replicated under plain tp and split by t with sequence parallelism (section 4.2.2).
Logits: vocab-parallel cross entropy splits them by t (Megatron
tensor_parallel/cross_entropy.py `vocab_parallel_cross_entropy`).
cp: ring attention splits the sequence, so every per-token term is computed at s / cp.
pp: each rank holds v chunks of ceil(L / (pp v)) layers (an upper bound where the layers do not
divide: torchtitan's split gives the first and last stages one layer fewer, Megatron needs an
even split); the micro-batches in flight on the first and the last rank follow the schedule
(estimator/parallel/schedule.py: 1F1B min(pp, m) on the first, Narayanan et al. 2021 section
2.2.1, Korthikanti et al. 2022 section 4.2.3; GPipe m; interleaved pp (1 + (pp-1)/(pp v))),
m = micro-batches per step (grad_accum, default pp).
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.parallel.layout import Layout
from estimator.parallel.schedule import in_flight, losses_in_flight
from estimator.spec import ModelSpec


@dataclass(frozen=True)
class Stage:
    """One pipeline stage's share of the model on one of its devices (before data-parallel
    sharding). `first`/`last`: holds the embedding / the lm_head and the loss."""

    first: bool
    last: bool
    layers: int  # decoder layers on the stage
    params: float  # all parameters on the device
    root: float  # embedding + lm_head on the device (FSDP2's root unit)
    layer: float  # one decoder layer on the device
    in_flight: float  # micro-batches (of all `layers`) whose activations the rank holds at once
    losses: int = 1  # micro-batches whose loss the last rank keeps for their backward


def param_groups(spec: ModelSpec) -> tuple[float, float, float, float]:
    """(embedding, lm_head, expert banks, everything else) parameter counts. A params-only spec
    with vocab and hidden given counts an untied vocab x hidden embedding and head."""
    if not spec.geometry_known:
        emb = float((spec.vocab or 0) * (spec.hidden or 0))
        emb = min(emb, spec.params_total / 4)
        return emb, emb, 0.0, spec.params_total - 2 * emb
    embed = float(sum(g.params for g in spec.others if g.name == "embed_tokens"))
    head = float(sum(lin.params for lin in spec.linears if lin.group == "head"))
    experts = float(sum(lin.params for lin in spec.linears if lin.experts > 1))
    return embed, head, experts, spec.params_total - embed - head - experts


def micro_batches(layout: Layout, grad_accum: int | None) -> int:
    """Micro-batches per step under a pipeline: grad_accum when it is more than 1, else pp
    (torchtitan@9dec370 torchtitan/parallelisms/pipeline_llama.py:67-68: `microbatches =
    pipeline_parallel_microbatches or parallel_dims.pp`); 1 without a pipeline."""
    if layout.pp == 1:
        return grad_accum or 1
    return grad_accum if grad_accum and grad_accum > 1 else layout.pp


def stages(spec: ModelSpec, layout: Layout, grad_accum: int | None) -> list[Stage]:
    """The ranks whose peaks differ: the only one (pp=1), or the first pipeline rank (the
    embedding, the most micro-batches in flight) and the last (the lm_head and the loss)."""
    embed, head, experts, dense = param_groups(spec)
    layers = spec.layers or 1
    p, v = layout.pp, layout.virtual
    per_rank = -(-layers // (p * v)) * v
    layer = (dense + experts / layout.ep) / layers / layout.tp
    m = micro_batches(layout, grad_accum)
    if p == 1:
        root = (embed + head) / layout.tp
        return [Stage(True, True, layers, root + layer * layers, root, layer, 1)]
    first_root, last_root = embed / layout.tp, head / layout.tp
    sched = layout.schedule
    return [
        Stage(
            True,
            False,
            per_rank,
            first_root + layer * per_rank,
            first_root,
            layer,
            in_flight(sched, m, p, v, 0),
        ),
        Stage(
            False,
            True,
            per_rank,
            last_root + layer * per_rank,
            last_root,
            layer,
            in_flight(sched, m, p, v, p - 1),
            losses_in_flight(sched, m, p),
        ),
    ]


def attention_score_term(spec: ModelSpec, seq: float, eager: bool) -> float:
    """5*a*s/h of Korthikanti Table 2 (0 when the scores are not stored: flash / SDPA)."""
    if not eager or not spec.num_heads or not spec.hidden:
        return 0.0
    return 5.0 * spec.num_heads * seq / spec.hidden


def tp_activation_factor(layout: Layout, score_term: float) -> float:
    """Share of one layer's saved activations a tp rank keeps (Korthikanti Table 2)."""
    t = layout.tp
    if t == 1:
        return 1.0
    if layout.sp:
        return 1.0 / t
    return (10.0 + 24.0 / t + score_term / t) / (34.0 + score_term)


def checkpoint_factor(layout: Layout) -> float:
    """Share of a checkpointed layer input a tp rank keeps: all of it, 1/t with sp."""
    return 1.0 / layout.tp if layout.sp else 1.0
