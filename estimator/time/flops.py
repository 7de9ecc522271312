"""FLOPs of one training step, by layer type, from the parameter inventory.

Conventions (every count below follows them):
- A multiply-add is 2 FLOPs; only matrix products are counted (norms, activations, rotary,
  softmax, dequantisation and the optimizer step are not), as in
  `torch.utils.flop_counter.FlopCounterMode`, which is what the tests compare against.
- Linear layers: forward 2 * in * out per token (biases are not counted; FlopCounterMode counts
  `addmm` as the product only). MoE expert banks count `active_experts` experts per token.
- Backward of a Linear: the activation gradient (2 * in * out per token) always; the weight
  gradient (the same again) only when the weight is trained. Full fine-tuning: 2x forward
  (Kaplan et al. 2020 / the 6*N*T rule); LoRA/QLoRA: the frozen base gets 1x forward, so its
  backward is about half of full fine-tuning's.
- Full-attention core (QK^T and PV): causal, counted over s^2/2 query-key pairs per sequence
  (FlashAttention's benchmark convention: `flops(..., causal) = 4*b*s^2*h*d / 2`). Sliding-window
  layers count min(position, window) keys per query. FlopCounterMode (and torch's
  `sdpa_flop_count`) does not halve for causal masks: its count is 2x ours for this term.
- Attention-core backward: 2.5x forward in the executed count (FlashAttention-2 recomputes the
  scores: 5 matmuls against 2; torch's `sdpa_backward_flop_count`), 2x in `model_flops`.
- Gated DeltaNet (linear attention): the chunked algorithm with chunk 64 (transformers'
  `torch_chunk_gated_delta_rule`, the reference of flash-linear-attention's
  `chunk_gated_delta_rule`), linear in sequence length; backward taken as 2x forward (each
  matmul gives two in backward; fla's kernels recompute a little more, not counted).
- Checkpointing (`gpu` or `offload`): the decoder layers' forward runs again during backward
  (HF `gradient_checkpointing_enable` wraps each decoder layer; embeddings and lm_head are not
  recomputed). `model_flops` never includes the recompute: it is the useful work used for MFU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from estimator.architectures.attention import chunked_pairs, core_head_dims
from estimator.lora import lora_rank_check, lora_targets
from estimator.memo import Memo, setup_key
from estimator.objective import no_grad_forwards, sequences
from estimator.spec import LAYER_CHUNKED, LAYER_FULL, LAYER_LINEAR, LAYER_SLIDING, Linear, ModelSpec

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

GDN_CHUNK = 64  # flash-linear-attention / transformers chunk size for chunk_gated_delta_rule
CHECKPOINTED = ("gpu", "offload")


@dataclass(frozen=True)
class PartFlops:
    """FLOPs of one part of the model for one step (all sequences of the batch)."""

    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    model: float = 0.0  # forward + backward as counted for MFU (no recompute)

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    def as_dict(self) -> dict[str, float]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "recompute": self.recompute,
            "total": self.total,
        }


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one optimizer step of `batch` sequences of `seq_len` tokens (one device's share
    for data-parallel runs: multiply by the number of ranks for the global step)."""

    forward: float
    backward: float
    recompute: float
    model_flops: float
    parts: dict[str, PartFlops] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tokens: int = 0
    reference: float = 0.0  # DPO's reference forward (estimator/objective.py)

    @property
    def total(self) -> float:
        """Executed FLOPs: forward + backward + recomputed forward + a reference forward."""
        return self.forward + self.backward + self.recompute + self.reference

    @property
    def per_token(self) -> float:
        return self.total / self.tokens if self.tokens else 0.0

    @property
    def model_per_token(self) -> float:
        return self.model_flops / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "forward": self.forward,
            "backward": self.backward,
            "recompute": self.recompute,
            "reference": self.reference,
            "total": self.total,
            "model_flops": self.model_flops,
            "tokens": self.tokens,
            "parts": {name: part.as_dict() for name, part in self.parts.items()},
            "notes": list(self.notes),
        }


def linear_forward_flops(linear: Linear, tokens: int) -> float:
    """2 FLOPs per multiply-add, bias ignored, active experts only (MoE): 2*in*out*tokens per
    instance. Source: Kaplan et al. 2020, Table 1 (forward = 2*N per token)."""
    return (
        2.0
        * linear.in_features
        * linear.out_features
        * linear.active_experts
        * linear.count
        * tokens
    )


def attention_pairs(seq_len: int, window: int | None = None, causal: bool = True) -> float:
    """Query-key pairs one attention layer scores for one sequence.

    Causal: s^2/2 (FlashAttention benchmark convention, the diagonal's s/2 ignored); non-causal:
    s^2. Sliding window w (causal, each query sees at most w keys): s^2/2 while s <= w, else
    s*w - w^2/2. Assumes no packing (one document per row, no block-diagonal mask)."""
    s = float(seq_len)
    if not causal:
        return s * s if window is None else s * min(s, float(window))
    if window is None or s <= window:
        return s * s / 2.0
    w = float(window)
    return s * w - w * w / 2.0


def attention_core_forward(
    spec: ModelSpec, seq_len: int, batch: int, *, causal: bool = True
) -> float:
    """QK^T and PV of every full/sliding attention layer: 2*pairs*heads*(d_qk + d_v) per
    sequence (torch `sdpa_flop_count` with pairs = s^2 when not causal). GQA does not change the
    count (keys are broadcast to the query heads)."""
    return _attention_core(spec, _attention_layers(spec), seq_len, batch, causal)


def _attention_layers(spec: ModelSpec) -> tuple[int, int, int]:
    """Full, sliding and chunked attention layers (what `attention_core_forward` counts)."""
    count = spec.count_layers
    return count(LAYER_FULL), count(LAYER_SLIDING), count(LAYER_CHUNKED)


def _attention_core(
    spec: ModelSpec, layers: tuple[int, int, int], seq_len: int, batch: int, causal: bool = True
) -> float:
    """`attention_core_forward` with the layers of each kind counted (`_attention_layers`)."""
    if not spec.num_heads or not spec.head_dim:
        return 0.0
    n_full, n_sliding, n_chunked = layers
    # a kind with no layers adds 0.0: skipped (x + 0.0 is x for the pairs, never -0.0)
    pairs = n_full * attention_pairs(seq_len, None, causal)
    if n_sliding:
        pairs += n_sliding * attention_pairs(seq_len, spec.sliding_window, causal)
    if n_chunked:
        pairs += n_chunked * chunked_pairs(seq_len, spec.attention_chunk, causal)
    return 2.0 * pairs * spec.num_heads * core_head_dims(spec) * batch


def gated_deltanet_forward(
    spec: ModelSpec, seq_len: int, batch: int, chunk: int = GDN_CHUNK
) -> float:
    """Chunked Gated DeltaNet core of every linear-attention layer, counted on transformers'
    `torch_chunk_gated_delta_rule` (the reference of flash-linear-attention's
    `chunk_gated_delta_rule`; q and k are repeated to the value heads). Per value head and chunk
    of C tokens (head dims dk, dv): k_beta@k^T and q@k^T (2 x 2*C^2*dk), the two unit-triangular
    solves for the new values and the decayed keys (C^2*dv + C^2*dk), intra-chunk attn@v_new
    (2*C^2*dv), two reads of the state and its update (3 x 2*C*dk*dv). Sequence padded to a
    multiple of C. Plus the depthwise causal conv1d, 2*conv_dim*kernel per output position
    (s + kernel - 1 positions, as torch pads)."""
    return gated_deltanet_matmul_forward(
        spec, seq_len, batch, chunk
    ) + gated_deltanet_solve_forward(spec, seq_len, batch, chunk)


def gated_deltanet_matmul_forward(
    spec: ModelSpec, seq_len: int, batch: int, chunk: int = GDN_CHUNK
) -> float:
    """The matmul and conv1d part of `gated_deltanet_forward` (what FlopCounterMode sees)."""
    geo = spec.linear_attention
    n_layers = spec.count_layers(LAYER_LINEAR)
    if geo is None or n_layers == 0:
        return 0.0
    c, dk, dv = chunk, geo.key_head_dim, geo.value_head_dim
    chunks = math.ceil(seq_len / c)
    per_chunk_head = 2 * 2 * c * c * dk + 2 * c * c * dv + 3 * 2 * c * dk * dv
    core = per_chunk_head * chunks * geo.num_value_heads
    conv = 2 * geo.conv_dim * geo.conv_kernel * (seq_len + geo.conv_kernel - 1)
    return float(n_layers * (core + conv) * batch)


def gated_deltanet_solve_forward(
    spec: ModelSpec, seq_len: int, batch: int, chunk: int = GDN_CHUNK
) -> float:
    """The two unit-lower-triangular solves per chunk and value head: C^2 FLOPs per right-hand
    column (C^2/2 multiply-adds), dv + dk columns (`torch.linalg.solve_triangular`, which
    FlopCounterMode does not count)."""
    geo = spec.linear_attention
    n_layers = spec.count_layers(LAYER_LINEAR)
    if geo is None or n_layers == 0:
        return 0.0
    c = chunk
    chunks = math.ceil(seq_len / c)
    per_chunk_head = c * c * (geo.key_head_dim + geo.value_head_dim)
    return float(n_layers * per_chunk_head * chunks * geo.num_value_heads * batch)


def _params_only(spec: ModelSpec, setup: TrainingSetup, tokens: int) -> StepFlops:
    """6*N*T for full training (Kaplan et al. 2020; Hoffmann et al. 2022 use the same), 4*N*T
    with a frozen base (no weight gradients), +2*N*T recomputed forward under checkpointing.
    N = the given parameter count, embeddings included; attention is not included."""
    n = float(spec.params_total)
    fwd = 2.0 * n * tokens
    bwd = (2.0 if setup.is_adapter else 4.0) * n * tokens
    rec = fwd if setup.checkpointing in CHECKPOINTED else 0.0
    part = PartFlops(fwd, bwd, rec, fwd + bwd)
    notes: tuple[str, ...] = (
        "params-only spec: 2*N*T forward, "
        + ("2*N*T (frozen base, no weight gradients)" if setup.is_adapter else "4*N*T")
        + " backward; attention not included (no geometry); N includes embeddings",
    )
    if setup.is_adapter:
        notes += ("params-only spec: adapter FLOPs not included",)
    ref = _reference(setup, fwd, 0.0)
    return StepFlops(fwd, bwd, rec, fwd + bwd + ref, {"params": part}, notes, tokens, ref)


@dataclass(frozen=True)
class _FlopsPlan:
    """What `step_flops` needs that does not depend on the tokens, per (spec, setup): each
    Linear's forward FLOPs per token (`linear_forward_flops` without its last factor, so that
    multiplying by the tokens repeats its arithmetic exactly) with its group, and the LoRA
    adapters' forward FLOPs per token, one per target."""

    linears: tuple[tuple[str, float], ...]
    lora: tuple[float, ...] | None
    notes: tuple[str, ...]
    # `linears` by group, in the order the groups first come (what `step_flops_totals` sums)
    groups: tuple[tuple[str, tuple[float, ...]], ...] = ()
    attention_layers: tuple[int, int, int] = (0, 0, 0)
    linear_attention: bool = False  # Gated DeltaNet layers (`gated_deltanet_forward` > 0)


def _flops_plan(spec: ModelSpec, setup: TrainingSetup) -> _FlopsPlan:
    notes: list[str] = [
        "attention core counted causal (s^2/2 pairs); FlopCounterMode counts s^2",
    ]
    linears = list(spec.linears)
    if not any(lin.group == "head" for lin in linears) and spec.vocab and spec.hidden:
        # tied embeddings: the output projection uses the embedding matrix
        linears.append(Linear("lm_head(tied)", spec.hidden, spec.vocab, 1, group="head"))
    per_token = tuple(
        (
            lin.group,
            2.0 * lin.in_features * lin.out_features * lin.active_experts * lin.count,
        )
        for lin in linears
    )
    lora = None
    if setup.is_adapter:
        targets = lora_targets(spec, setup)
        lora_rank_check(spec, setup, targets)
        r = setup.lora_rank
        lora = tuple(2.0 * r * (t.in_features + t.out_features) * t.count for t in targets)
        notes.append(
            "frozen base: activation gradients only (the first layer's are counted although "
            "autograd skips them when the embeddings are frozen)"
        )
    groups: dict[str, list[float]] = {}
    for group, flops in per_token:
        groups.setdefault(group, []).append(flops)
    return _FlopsPlan(
        per_token,
        lora,
        tuple(notes),
        tuple((g, tuple(f)) for g, f in groups.items()),
        _attention_layers(spec),
        spec.linear_attention is not None and spec.count_layers(LAYER_LINEAR) > 0,
    )


_PLANS: Memo[_FlopsPlan] = Memo()


class FlopsTotals(NamedTuple):
    """`StepFlops.total` and `.model_flops` alone (what step time needs), without the parts."""

    total: float
    model_flops: float


def step_flops(spec: ModelSpec, setup: TrainingSetup, seq_len: int, batch: int) -> StepFlops:
    """FLOPs of one step of `batch` sequences of `seq_len` tokens, by part.

    Parts: each Linear group (attention, linear_attention, mlp, experts, shared_expert, router,
    head), `lora` (adapters), `attention_core`, `linear_attention_core`. See the module
    docstring for the conventions; assumes unpacked sequences of exactly `seq_len` tokens.
    A DPO row is two sequences, and its reference forward is `reference` (`_reference`)."""
    batch = sequences(batch, setup)
    tokens = seq_len * batch
    if not spec.geometry_known:
        return _params_only(spec, setup, tokens)
    sums, notes = _group_sums(spec, setup, seq_len, batch)
    parts = {group: PartFlops(*v) for group, v in sums.items()}
    fwd_total = sum(v[0] for v in sums.values())  # = sum of the parts' forward, in order
    bwd_total = sum(v[1] for v in sums.values())
    rec_total = sum(v[2] for v in sums.values())
    model = sum(v[3] for v in sums.values())
    lora = sums["lora"][0] if "lora" in sums else 0.0
    ref = _reference(setup, fwd_total, lora)
    return StepFlops(fwd_total, bwd_total, rec_total, model + ref, parts, tuple(notes), tokens, ref)


def _reference(setup: TrainingSetup, forward: float, lora: float) -> float:
    """The no-grad forwards a preference step runs beside the policy's (`no_grad_forwards`,
    estimator/objective.py): DPO's reference forward, the policy's forward of the same
    sequences without the adapters under peft (they are disabled, trl 1.16.0
    dpo_trainer.py:1328-1336); KTO's two reference forwards and the policy's KL forward, of
    sequences as many and as long as the rows; model FLOPs too, the step needs them."""
    through_reference, through_policy = no_grad_forwards(setup)
    if not (through_reference or through_policy):
        return 0.0
    return through_reference * (forward - lora) + through_policy * forward


def step_flops_totals(
    spec: ModelSpec,
    setup: TrainingSetup,
    seq_len: int,
    batch: int,
    skey: tuple[Any, ...] | None = None,
) -> FlopsTotals:
    """`step_flops(...).total` and `.model_flops`: `_group_sums`' sums (each part's, from zero,
    in the order its terms come; then the parts in the order they first come) without building
    the parts, the notes or a dict. `skey`: `setup_key(setup)` when the caller has it."""
    batch = sequences(batch, setup)
    if not spec.geometry_known:
        p = _params_only(spec, setup, seq_len * batch)
        return FlopsTotals(p.total, p.model_flops)
    tokens = seq_len * batch
    recompute_on = setup.checkpointing in CHECKPOINTED
    trainable = not setup.is_adapter  # LoRA/QLoRA: every base weight (and lm_head) is frozen
    skey = setup_key(setup) if skey is None else skey
    plan = _PLANS.call((spec, skey), None, _flops_plan, spec, setup)
    fwd_total = bwd_total = rec_total = model_total = 0.0
    for group, per_tokens in plan.groups:
        f = 0.0
        for per_token in per_tokens:
            f += per_token * tokens  # linear_forward_flops
        # the backward (2 fwd trained, fwd frozen), recompute (fwd or 0) and, frozen, model
        # (fwd + fwd) sums add each term of `f` times 2, 1 or 0: doubling is exact in binary
        # floating point, so each is that multiple of `f`, bit for bit. A trained group's
        # model sum adds fwd + 2 fwd (3 fwd, rounded per term): its own sum.
        r = f if recompute_on and group != "head" else 0.0
        if trainable:
            b, m = 2.0 * f, 0.0
            for per_token in per_tokens:
                fwd = per_token * tokens
                m += fwd + 2.0 * fwd
        else:
            b, m = f, 2.0 * f
        fwd_total += f
        bwd_total += b
        rec_total += r
        model_total += m
    lora = 0.0
    if plan.lora is not None:
        fwd = 0.0  # `0.0 + sum(...)`: the same additions in the same order, a float for none
        for per_token in plan.lora:
            fwd += per_token * tokens
        lora = fwd
        fwd_total += fwd
        bwd_total += 2.0 * fwd
        rec_total += fwd if recompute_on else 0.0
        model_total += 3.0 * fwd
    attn = _attention_core(spec, plan.attention_layers, seq_len, batch)
    if attn:
        fwd_total += attn
        bwd_total += 2.5 * attn
        rec_total += attn if recompute_on else 0.0
        model_total += 3.0 * attn
    if plan.linear_attention:
        gdn = gated_deltanet_forward(spec, seq_len, batch)
        if gdn:
            fwd_total += gdn
            bwd_total += 2.0 * gdn
            rec_total += gdn if recompute_on else 0.0
            model_total += 3.0 * gdn
    ref = _reference(setup, fwd_total, lora)  # 0.0 without one: the sums stay bit for bit
    return FlopsTotals(fwd_total + bwd_total + rec_total + ref, model_total + ref)


def _group_sums(
    spec: ModelSpec, setup: TrainingSetup, seq_len: int, batch: int
) -> tuple[dict[str, list[float]], list[str]]:
    """Per part (Linear group, lora, attention cores): [forward, backward, recompute, model]
    FLOPs, each summed from zero in the order the terms come; and the notes."""
    tokens = seq_len * batch
    recompute_on = setup.checkpointing in CHECKPOINTED
    adapter = setup.is_adapter
    plan = _PLANS.get((spec, setup_key(setup)), None, lambda: _flops_plan(spec, setup))
    sums: dict[str, list[float]] = {}  # group -> [forward, backward, recompute, model]
    notes = list(plan.notes)

    def add(group: str, fwd: float, bwd: float, rec: float, model: float) -> None:
        # PartFlops summed per group, from zero, in the order the parts come
        old = sums.get(group)
        if old is None:
            sums[group] = [0.0 + fwd, 0.0 + bwd, 0.0 + rec, 0.0 + model]
        else:
            old[0] += fwd
            old[1] += bwd
            old[2] += rec
            old[3] += model

    for group, fwd_per_token in plan.linears:
        fwd = fwd_per_token * tokens  # linear_forward_flops
        trainable = not adapter  # LoRA/QLoRA: every base weight (and lm_head) is frozen
        bwd = 2.0 * fwd if trainable else fwd
        rec = fwd if recompute_on and group != "head" else 0.0
        add(group, fwd, bwd, rec, fwd + bwd)

    if plan.lora is not None:
        fwd = sum(per_token * tokens for per_token in plan.lora)
        add("lora", fwd, 2.0 * fwd, fwd if recompute_on else 0.0, 3.0 * fwd)

    attn = attention_core_forward(spec, seq_len, batch)
    if attn:
        add("attention_core", attn, 2.5 * attn, attn if recompute_on else 0.0, 3.0 * attn)
    gdn = gated_deltanet_forward(spec, seq_len, batch)
    if gdn:
        add("linear_attention_core", gdn, 2.0 * gdn, gdn if recompute_on else 0.0, 3.0 * gdn)
        notes.append(f"linear attention: chunked Gated DeltaNet, chunk {GDN_CHUNK}")

    return sums, notes
