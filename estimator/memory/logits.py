"""`logits`: the loss's share of the step: lm_head output, its fp32 upcast, log-softmax and
their gradients, for each loss implementation a stack can run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from estimator import lazy_numpy as np
from estimator.dtypes import BF16, FP32, INT64
from estimator.memory.weights import amp_full, kbit_fp32
from estimator.objective import PREFERENCE, chosen_nll, reference_forward
from estimator.profile import Profile
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup
    from estimator.spec import ModelSpec

# Liger's fused linear cross-entropy (linkedin/Liger-Kernel main ead96b61,
# src/liger_kernel/ops/fused_linear_cross_entropy.py:68-69): chunk_size =
# next_power_of_2(ceil(BT / ceil(V / H))) rows; :72 grad_input = zeros_like(input) (BT x H);
# :114 logits_chunk = input_chunk @ weight.t() in the input dtype, :212 its gradient written in
# place; :86 an fp32 loss per row.


def loss_bytes_per_logit(compute_bytes: int, hold_output: bool, softcap: int = 0) -> int:
    """transformers `ForCausalLMLoss` (loss/loss_utils.py): `logits.float()` then
    `cross_entropy` = log_softmax (saves its fp32 output) + nll_loss.
    Forward peak: logits (compute dtype) + fp32 upcast + fp32 log-softmax output.
    Backward peak: saved log-softmax output + nll gradient + log-softmax input gradient, all
    fp32 = 12 bytes. The bf16 logits stay alive only if the caller holds the model output
    (HF Trainer drops it before backward). With fp32 compute the upcast is a no-op.
    `softcap`: bytes per logit of the softcap's saved tanh output (`final_logit_softcap`), one
    more logits-sized tensor through the loss's forward and backward."""
    held = (compute_bytes if hold_output else 0) + softcap
    return max(loss_forward_bytes_per_logit(compute_bytes, hold_output, softcap), 3 * FP32 + held)


def loss_forward_bytes_per_logit(compute_bytes: int, hold_output: bool, softcap: int = 0) -> int:
    """The forward half of `loss_bytes_per_logit`: logits + fp32 upcast + fp32 log-softmax
    (+ the held model output, + the softcap's saved tanh output)."""
    upcast = 0 if compute_bytes == FP32 else FP32
    held = (compute_bytes if hold_output else 0) + softcap
    return compute_bytes + upcast + FP32 + held


def loss_parallel_bytes_per_logit(compute_bytes: int, hold_output: bool) -> int:
    """Bytes per local (vocab-sharded) logit of torch's vocab-parallel cross-entropy
    (`torch.distributed.tensor.parallel.loss_parallel`, which torchtitan enables for tensor
    parallelism), whose custom DTensor handlers replace the fused log_softmax / nll kernels by
    decompositions on the local shard (torch 2.13, torch/distributed/tensor/parallel/loss.py):
    forward `_log_softmax` (:204 the fp32 upcast, :212 `shifted = x - x_max`, :213
    `torch.exp(shifted)`): the input, its upcast, `shifted` and its exponential alive together;
    backward `_nll_loss_and_log_softmax_backward` (:470 `grad_input = torch.zeros_like(x)`,
    :518 `(grad_input + torch.exp(x)) * grad_output`): the saved fp32 log-probabilities,
    `grad_input`, `exp(x)` and their sum, 16 bytes (the one-device kernels peak at 12,
    `loss_bytes_per_logit`)."""
    upcast = 0 if compute_bytes == FP32 else FP32
    forward = compute_bytes + upcast + 2 * FP32
    backward = 4 * FP32
    held = compute_bytes if hold_output else 0
    return max(forward, backward) + held


def loss_parallel_extra_bytes(
    local_logits: Any, setup: TrainingSetup, profile: Profile, logit_dtype: int
) -> Any:
    """What the vocab-parallel loss adds over the one-device full loss for `local_logits`
    (tokens x vocab / tp) logits on a tensor-parallel rank: 0 unless the loss is the eager full
    cross-entropy with bytes derived from dtypes (a compiled loss or a profile's fixed bytes per
    logit keep the one-device figure)."""
    stack = load_stack(setup.stack)
    compiled = bool(setup.compile) and setup.loss in (stack.get("loss_compiled") or ())
    if setup.loss != "full" or compiled or profile.get("memory", "logits_bytes_per_logit"):
        return local_logits * 0.0
    hold = bool(profile.get("memory", "hold_model_output"))
    extra = loss_parallel_bytes_per_logit(logit_dtype, hold) - loss_bytes_per_logit(
        logit_dtype, hold
    )
    return local_logits * float(max(extra, 0))


@dataclass(frozen=True)
class LossRule:
    """What the loss's terms (`logits_bytes`, `loss_bytes`, `loss_backward_activations`) read
    from the setup, its stack and the profile, read once per (setup, profile, logits dtype) by
    `loss_rule` (memory/model.py keeps it with the length-free terms) and used at every
    length."""

    loss: str  # setup.loss
    compiled: bool  # the loss runs compiled (setup.compile and in the stack's `loss_compiled`)
    per_logit: Any  # the one-device full loss's bytes per logit (the profile's, or derived)
    fixed_chunked: Any  # the profile's `chunked_logits_fixed_bytes` (seed 000's hand rule)
    num_chunks: Any  # the stack's `loss_num_chunks` (torchtune)
    chunk: int  # setup.loss_chunk or 4096 positions
    row_scope: bool  # the stack's `loss_chunk_scope` is `row`
    upcasts_head: bool  # the stack's `loss_upcasts_head` (TRL)
    target: float  # the stack's `loss_target_bytes` (Unsloth), 4 GiB without
    # the stack's `loss_target_free_fraction` (Unsloth): the target is at most this share of
    # the card's free memory at the first loss (`memory.model.on_card`); None: no such rule
    free_fraction: float | None
    torchtune_eager: bool  # torchtune 0.6.1's eager loss, its own moments (`logits_bytes`)
    torchtune_backward: bool  # its backward's non-vocab tensors (`loss_backward_activations`)
    eval_skips_logits: bool = False  # setup.eval_skip_logits (memory/evaluation.py)
    # TRL's fused LM head (the stack's `loss_vocab_tile`, `trl_logprob_bytes`): the tile
    # buffer's columns, and the bytes per value of the head's weight; None: not that loss
    vocab_tile: int | None = None
    head_bytes: int = BF16
    # TRL 1.0-1.9's preference trainers with the full logits (`preference_full_logits_bytes`):
    # the bytes per value of the logits the model returns, whether the reference's are held
    # beside them, whether DPO's entropy metric copies them, whether the chosen half's
    # cross-entropy runs (ORPO, CPO); preference_logits None: not that loss
    preference_logits: int | None = None
    reference_logits: bool = False
    entropy_copy: bool = False
    chosen_nll: bool = False
    index_copy: bool = False  # KTO's index_select of the desirable and undesirable rows
    softcap: int = 0  # bytes per logit of the softcapped logits' saved tanh (`final_logit_softcap`)


def loss_free_fraction(setup: TrainingSetup) -> float | None:
    """The stack's `loss_target_free_fraction` where `setup` runs that stack's own loss
    (Unsloth's fused loss sizes its chunks by the card's free memory); None otherwise."""
    if setup.loss != "unsloth":
        return None
    fraction = load_stack(setup.stack).get_optional("loss_target_free_fraction", None)
    return None if fraction is None else float(fraction)


def loss_rule(
    setup: TrainingSetup, profile: Profile, logit_dtype: int, softcap: int = 0
) -> LossRule:
    """The `LossRule` of `setup` under `profile` with logits in `logit_dtype` bytes;
    `softcap`: bytes per logit of the softcapped logits' saved tanh (`final_logit_softcap`)."""
    stack = load_stack(setup.stack)
    compiled = bool(setup.compile) and setup.loss in (stack.get("loss_compiled") or ())
    fixed_chunked = profile.get("memory", "chunked_logits_fixed_bytes")
    num_chunks = stack.get("loss_num_chunks")
    chunked_output = setup.loss == "chunked" and bool(num_chunks)
    return LossRule(
        loss=setup.loss,
        compiled=compiled,
        per_logit=profile.get("memory", "logits_bytes_per_logit")
        or loss_bytes_per_logit(
            logit_dtype, bool(profile.get("memory", "hold_model_output")), softcap
        ),
        fixed_chunked=fixed_chunked,
        num_chunks=num_chunks,
        chunk=setup.loss_chunk or 4096,
        row_scope=stack.get("loss_chunk_scope") == "row",
        upcasts_head=bool(stack.get("loss_upcasts_head")),
        target=float(stack.get("loss_target_bytes") or 4 * 2**30),
        free_fraction=loss_free_fraction(setup),
        torchtune_eager=chunked_output and not (compiled or fixed_chunked),
        torchtune_backward=chunked_output and not compiled,
        eval_skips_logits=setup.eval_skip_logits,
        vocab_tile=None if fixed_chunked else trl_vocab_tile(setup),
        head_bytes=head_weight_bytes(setup),
        preference_logits=preference_output_bytes(setup),
        reference_logits=reference_forward(setup),
        entropy_copy=setup.objective in ("dpo", "dpo-precomputed", "kto"),
        chosen_nll=chosen_nll(setup),
        index_copy=setup.objective == "kto",
        softcap=softcap,
    )


def preference_output_bytes(setup: TrainingSetup) -> int | None:
    """Bytes per value of the logits TRL 1.0-1.9's preference trainers read
    (`preference_full_logits_bytes`) where `setup` runs one (a preference objective with the
    full loss); None otherwise. Under autocast accelerate wraps the model's forward so that
    every bf16 output is returned as an fp32 copy (accelerate 1.16.0 accelerator.py:1796
    `convert_outputs_to_fp32`, utils/operations.py:872-885 `tensor.float()`), so the logits are
    fp32 even where lm_head ran in bf16; without autocast they are the head's output dtype
    (`head_weight_bytes`)."""
    if setup.objective not in PREFERENCE or setup.loss != "full":
        return None
    return FP32 if setup.autocast else head_weight_bytes(setup)


def trl_vocab_tile(setup: TrainingSetup) -> int | None:
    """The stack's `loss_vocab_tile` where `setup`'s loss is its chunked loss (TRL's fused LM
    head, `trl_logprob_bytes`); None otherwise."""
    if setup.loss != "chunked":
        return None
    tile = load_stack(setup.stack).get_optional("loss_vocab_tile", None)
    return None if tile is None else int(tile)


def head_weight_bytes(setup: TrainingSetup) -> int:
    """Bytes per value of the LM head's weight: fp32 under AMP full fine-tuning (`amp_full`:
    the weights stay in their fp32 load dtype), fp32 precision, or kbit preparation
    (`kbit_fp32`: peft casts lm_head to fp32); bf16 otherwise."""
    if amp_full(setup) or setup.precision == "fp32" or kbit_fp32(setup):
        return FP32
    return BF16


def _labelled_positions(tokens: Any, seq: Any) -> Any:
    """The positions TRL's fused head scores: every row's but its last (trl/trainer/utils.py:1618
    `last_hidden_state[:, :-1]`), tokens - rows."""
    return tokens - tokens / np.maximum(seq, 1)


# TRL 1.0-1.9's entropy metric (`entropy_from_logits`, trl v1.8.0 trl/trainer/utils.py:476-510):
# `chunk_size` rows of the flattened logits at a time
ENTROPY_CHUNK_ROWS = 128


def preference_full_logits_bytes(rule: LossRule, tokens: Any, vocab: int) -> Any:
    """The loss of TRL 1.0-1.9's preference trainers on the `tokens` positions of the
    micro-batch's sequences (2 x batch for pairs, batch for KTO's rows), with the logits in
    `rule.preference_logits` bytes (c).
    The policy's forward returns the full logits (kept by `outputs` until the loss returns);
    `selective_log_softmax` (trl v1.8.0 trl/trainer/utils.py:429-469) then
    - c = 4: gathers the labels' logits and a log-sum-exp per row, both saving the logits
      themselves (torch tools/autograd/derivatives.yaml: `gather` and `logsumexp` save `self`);
    - c = 2: a log-softmax of each row, each output saved (`_log_softmax` saves its result),
      one more logits-sized tensor over the rows.
    Backward (c = 4), before the head's: the saved logits, the rows' log-sum-exp gradients
    stacked by `unbind`'s backward, and `gather`'s backward, a zeros tensor and its
    out-of-place `scatter_add`, four logits-sized fp32 tensors together; for c = 2 the
    backward's logits-sized bf16 tensors stay under the forward's (both measured in the
    probe's trace of TRL 1.8.0's steps, tests/probe/test_dpo_full_logits.py,
    tests/probe/test_orpo_full_logits.py).
    DPOTrainer (trl v1.8.0 trl/trainer/dpo_trainer.py:1278-1334 and :1536; v1.9.0 the same at
    :1329-1385, :1587; `rule.reference_logits`, `rule.entropy_copy`): the reference's forward
    (no grad) returns its own logits, alive to the loss's end; the metrics'
    `entropy_from_logits(shift_logits.detach())` reshapes the shifted (non-contiguous) logits,
    a copy (c), and takes 128 rows at a time through log_softmax, exp and their product (three
    chunk-sized tensors).
    ORPOTrainer, and CPOTrainer unless `cpo_alpha` is 0 (`rule.chosen_nll`; trl v1.8.0
    trl/experimental/orpo/orpo_trainer.py:782-803, cpo/cpo_trainer.py:825-844): before the
    log-probabilities, `nn.CrossEntropyLoss` of the chosen half, first `.contiguous()` of its
    shifted (non-contiguous) logits, a copy of half the logits (c / 2 per logit of the pair),
    freed when the function returns, then the log-softmax of that copy, saved through the
    backward (c / 2). In the backward of the log-probabilities (c = 4) the saved half is
    alive: 4 x 4 + 2 bytes per logit. Without autocast (c = 2) the forward's moment is the
    larger: logits + the saved half + the rows' saved log-softmax outputs, 2.5 x c; the
    backward's is as large on CUDA (its two paths' logits-sized gradients summed in place,
    torch/csrc/autograd/input_buffer.cpp `accumulate`, where the probe's trace sums out of
    place: probe/grad_sums.py).
    KTOTrainer (trl v1.8.0 trl/trainer/kto_trainer.py:1495-1535 and :1588; `rule.index_copy`)
    holds DPO's reference logits and entropy copy over its rows (one sequence each), and copies
    the policy's logits of the desirable and of the undesirable rows (`index_select`,
    :1513-1514: together one logits-sized tensor, c) for its metrics, alive to the loss's end:
    under autocast the forward's moment (4 x 4 bytes per logit and the entropy's chunks) is
    the larger; without it the forward holds 5 x c with the rows' saved log-softmax.
    A model that softcaps its logits (Gemma 2) keeps the policy's saved tanh output
    (`rule.softcap` bytes per logit, made by the model's forward: `final_logit_softcap`)
    through both moments. Shifted positions (each row's last dropped) are counted as all
    positions, an upper bound by one position per sequence. Not modelled: DPO's reference
    forward runs its layers beside the policy's held logits, so where the forward moment is
    the larger (c = 2) a layer's no-grad transient can set the peak: eager attention's seq x
    seq scores at small vocabularies (small Gemma 2, bf16 without autocast, 512 tokens: -11 %,
    the logits themselves exact)."""
    c = rule.preference_logits
    assert c
    saved = c if c != FP32 else 0  # bf16: each row's saved log-softmax output
    nll_half = c / 2 if rule.chosen_nll else 0  # the chosen half's saved log-softmax
    held = c + saved + nll_half + rule.softcap
    held += c if rule.reference_logits else 0
    held += c if rule.entropy_copy else 0
    held += c if rule.index_copy else 0
    forward = tokens * vocab * held
    if rule.entropy_copy:
        forward = forward + np.minimum(tokens, ENTROPY_CHUNK_ROWS) * vocab * 3 * c
    if rule.chosen_nll:  # the cross-entropy's moment: its contiguous copy beside its output
        forward = np.maximum(forward, tokens * vocab * (c + c + rule.softcap))
    if c != FP32:
        return forward
    return np.maximum(forward, tokens * vocab * (4 * FP32 + nll_half + rule.softcap))


def trl_tile_bytes(rule: LossRule, tokens: Any, seq: Any, compute: int) -> Any:
    """The one vocab-wide tensor of TRL's fused head (`trl_logprob_bytes`): its tile buffer,
    min(n, 4096) positions x `loss_vocab_tile` columns in the compute dtype."""
    assert rule.vocab_tile
    return np.minimum(_labelled_positions(tokens, seq), rule.chunk) * rule.vocab_tile * compute


def trl_logprob_bytes(
    rule: LossRule,
    tokens: Any,
    seq: Any,
    shape: tuple[int, int],
    dtypes: tuple[int, int],
    head_trained: bool = False,
    forward_only: bool = False,
) -> Any:
    """TRL 1.16.0's fused LM head (`add_fused_lm_head`, trl/trainer/utils.py:1548), the
    SFTTrainer's loss: the backbone's last hidden states but the last position of each row
    (:1618, `n` = tokens - rows), on CUDA only the positions with a label (:1645
    `hidden_states[mask]`: a copy, saved for the backward, counted with the head's saved input,
    `head_input_saved`), then ChunkedLogProbFunction (trl/kernels/chunked_logprob.py:299),
    which never makes the logits: one buffer of min(n, 4096) positions x `loss_vocab_tile`
    columns in the compute dtype (:347, :413; the autocast dtype, else the hidden states',
    :329-331) that each tile of the head's projection overwrites, whatever the vocabulary.
    Forward: the int64 targets (:1647), seven fp32 statistics per position (:340-346), the
    buffer, the hidden chunk's and the weight tile's casts to the compute dtype when they are
    in another (:352, :356), then log_z, the log-probabilities and the entropy (:378-380).
    Backward: the saved targets, log_z and entropy, an fp32 gradient of the hidden states
    (:405-407), the buffer, the incoming gradient (:414), the same casts (:420, :423), and at
    the return the gradient cast to the hidden states' dtype (:456); a trained head adds an
    fp32 weight gradient (:408-410) and its cast to the weight's dtype (:457; none for an fp32
    weight, whose fp32 buffer is the gradient itself). The Triton kernels that fold each tile
    (:359-371, :430-446) and the fp32-out addmm on CUDA (:59-60) allocate nothing. `dtypes`:
    (compute, hidden states') bytes; returns the larger moment (`forward_only`: the forward's,
    as the no-grad evaluation runs it)."""
    vocab, hidden = shape
    compute, hidden_dtype = dtypes
    assert rule.vocab_tile
    n = _labelled_positions(tokens, seq)
    rows = np.minimum(n, rule.chunk)
    tile = trl_tile_bytes(rule, tokens, seq, compute)
    hidden_cast = rows * hidden * compute if hidden_dtype != compute else 0.0
    weight_cast = 0.0
    if rule.head_bytes != compute:
        weight_cast = min(vocab, rule.vocab_tile) * hidden * compute
    # the backward keeps its weight tile's cast in a local (`w_chunk`, :423), so from the second
    # tile on the next cast is made while the last one is alive; the forward's is a temporary
    tiles = np.ceil(n / rule.chunk) * math.ceil(vocab / rule.vocab_tile)
    forward = n * (INT64 + 10 * FP32) + tile + hidden_cast + weight_cast
    if forward_only:
        return forward
    grad_back = n * hidden * hidden_dtype if hidden_dtype != FP32 else 0.0
    backward_casts = hidden_cast + weight_cast * np.where(tiles > 1, 2.0, 1.0)
    backward = n * (INT64 + 3 * FP32 + hidden * FP32) + grad_back + tile + backward_casts
    if head_trained:
        head = vocab * hidden
        cast = head * rule.head_bytes if rule.head_bytes != FP32 else 0
        backward = backward + head * FP32 + cast
    return np.maximum(forward, backward)


def final_logit_softcap(spec: ModelSpec, setup: TrainingSetup, logit_dtype: int) -> int:
    """Bytes per logit of the saved tanh output where the loss softcaps the logits of a model
    that softcaps (`spec.logit_softcap`): tanh saves its output (torch
    tools/autograd/derivatives.yaml `tanh: tanh_backward(grad, result)`). `full` on a stack
    running transformers' forward (its `final_logit_softcap` fact): `logits / cap`, `tanh`,
    `* cap` on the model's logits (transformers 5.25.0 models/gemma2/modeling_gemma2.py:520-523),
    in their dtype; a chunked loss that upcasts the head (`loss_upcasts_head`, TRL v1.9.0's
    chunked_nll) softcapped each chunk's fp32 logits itself (trl v1.9.0
    trl/trainer/sft_trainer.py:106-107); 0 elsewhere (TRL 1.16.0's fused head softcaps inside
    its tile kernel, trl/kernels/chunked_logprob.py:65-75 `_transform`; Liger, Cut
    Cross-Entropy and Unsloth make their logits inside their kernels; torchtune's and
    torchtitan's modules)."""
    if not spec.logit_softcap:
        return 0
    stack = load_stack(setup.stack)
    if setup.loss == "full" and stack.get_optional("final_logit_softcap", False):
        return logit_dtype
    if setup.loss == "chunked" and stack.get("loss_upcasts_head"):
        return FP32
    return 0


def chunked_output_loss_bytes(
    tokens: Any, chunk: Any, vocab: int, logit_dtype: int, grad_hidden: Any, head_grad: float = 0.0
) -> Any:
    """torchtune 0.6.1's `CEWithChunkedOutputLoss` (the last release; the recipes' loss,
    recipes/configs/llama3_1/8B_lora_single_device.yaml:70-71), eager. The model returns a
    list of `num_output_chunks` logit chunks made together (modules/transformer.py:482-501
    `chunked_output`: `self.output(chunk)` for each `last_hidden_state.chunk(n, dim=1)`), so
    every chunk's logits are alive in the compute dtype; the loss upcasts one chunk at a time
    (modules/loss/ce_chunked_output_loss.py:35-43 `F.cross_entropy(logits.float(), ...)`,
    :80-81 the loop) and each chunk's fp32 log-softmax output is saved for the backward.
    Forward peak, at the last chunk: all logits + all log-softmax outputs + that chunk's fp32
    upcast (none when the logits are fp32: `.float()` returns them). The recipe drops the logit
    list before the backward (recipes/lora_finetune_single_device.py:658-659 `del logits`);
    the backward then holds the saved log-softmax outputs, one chunk's nll and log-softmax
    gradients (fp32) and the hidden states' gradient. A trained output projection's weight
    gradient (`head_grad`, full fine-tuning) is made by that backward (each chunk's
    `self.output(chunk)` matmul backward, summed by the engine), so it counts with the backward
    moment only: measured on `--stack torchtune` full fine-tuning of small-llama at 512 tokens,
    the step's peak is the forward's, with no gradient alive. The backward runs in two phases:
    the chunks' `self.output(chunk)` matmuls are recorded in the model's forward, before the
    loss's ops, and the engine's ready queue runs the higher sequence number first
    (torch/csrc/autograd/engine.h `ReadyQueue::CompareNodeTaskTime`), so every chunk's cross-entropy
    backward runs first (the `ce` phase: the saved log-softmax outputs, one chunk's fp32 nll and
    log-softmax gradients; each leaves its chunk's logit gradient in the logit dtype), then
    the matmul backwards (the `matmul` phase: the other chunks' logit gradients, the head's
    gradient buffer and the next chunk's weight-gradient contribution, which the engine adds
    into the buffer after it is made, torch/csrc/autograd/input_buffer.cpp `accumulate`: two
    head gradients). (torchtune main's LinearCrossEntropyLoss makes the logits inside the loss
    per chunk instead; not a release.)"""
    upcast = 0 if logit_dtype == FP32 else FP32
    forward = tokens * vocab * (logit_dtype + FP32) + chunk * vocab * upcast
    ce = tokens * vocab * FP32 + chunk * vocab * 2 * FP32 + grad_hidden
    matmul = (tokens - chunk) * vocab * logit_dtype + grad_hidden + 2 * head_grad
    return np.maximum(forward, np.maximum(ce, matmul))


def loss_backward_activations(
    rule: LossRule, tokens: Any, shape: tuple[int, int], dtypes: tuple[int, int], head_grad: float
) -> Any:
    """The non-vocab tensors that the loss's backward adds at their own most, which the
    tracker files as activations: for torchtune 0.6.1's eager loss the matmul phase of
    `chunked_output_loss_bytes` (the chunks' hidden-state gradients, and with a trained head
    the next chunk's weight-gradient contribution before the engine adds it into the head's
    gradient buffer, torch/csrc/autograd/input_buffer.cpp `accumulate`); 0 for the others."""
    if rule.torchtune_backward:
        return tokens * shape[1] * dtypes[1] + head_grad
    return tokens * 0.0


def _next_pow2(x: Any) -> Any:
    return 2.0 ** np.ceil(np.log2(np.maximum(x, 1)))


def chunk_positions(rule: LossRule, tokens: Any, seq: Any) -> Any:
    """Positions of one loss chunk. `row` scope: `loss_chunk` positions of every row (probe
    loss.py:44-47: split along the sequence), so batch x min(seq, chunk); `flat`: chunks of the
    flattened micro-batch (TRL sft_trainer.py:203-214, Unsloth, torchtune); a stack with
    `loss_num_chunks` splits the tokens into that many chunks (torchtune)."""
    n = rule.num_chunks
    if n:  # torch.chunk(n, dim=1) of every row: ceil(seq / n) positions each
        return tokens / np.maximum(seq, 1) * np.ceil(seq / n)
    chunk = rule.chunk
    if rule.row_scope:
        batch = tokens / np.maximum(seq, 1)
        return batch * np.minimum(seq, chunk)
    return np.minimum(tokens, chunk)


def logits_bytes(
    rule: LossRule,
    tokens: Any,
    seq: Any,
    shape: tuple[int, int],
    dtypes: tuple[int, int],
    head_grad: float = 0.0,
) -> Any:
    """Peak bytes of the loss (`loss_bytes`) with a trained head's weight gradient
    (`head_grad`), which the loss's backward makes while the loss holds its tensors: added to
    the loss's one moment, or for torchtune 0.6.1's eager loss to its backward moment only
    (`chunked_output_loss_bytes`)."""
    if rule.vocab_tile:
        return trl_logprob_bytes(rule, tokens, seq, shape, dtypes, head_trained=bool(head_grad))
    if rule.torchtune_eager:
        vocab, hidden = shape
        chunk = chunk_positions(rule, tokens, seq)
        grad_hidden = tokens * hidden * dtypes[1]
        return chunked_output_loss_bytes(tokens, chunk, vocab, dtypes[0], grad_hidden, head_grad)
    return loss_bytes(rule, tokens, seq, shape, dtypes) + head_grad


def loss_bytes(
    rule: LossRule, tokens: Any, seq: Any, shape: tuple[int, int], dtypes: tuple[int, int]
) -> Any:
    """Peak bytes of the loss. `shape` = (vocab, hidden); `dtypes` = (logits dtype, hidden
    dtype). full: tokens x vocab x bytes-per-logit. chunked (checkpointed per chunk, probe and
    TRL chunked_nll): one chunk's logits plus the gradient of the hidden states being
    accumulated; with `loss_upcasts_head` also TRL's fp32 copy of lm_head's weight
    (sft_trainer.py:101); with `loss_num_chunks` torchtune 0.6.1's CEWithChunkedOutputLoss
    (`chunked_output_loss_bytes`).
    liger: see the module note. cce: Cut Cross-Entropy never materialises the logits: an fp32
    log-sum-exp per token and the hidden-state gradient (Wijmans et al. 2024, "Cut Your Losses
    in Large-Vocabulary Language Models", section 4). unsloth: the hidden-state gradient made in
    the forward (unsloth_zoo fused_losses/cross_entropy_loss.py:243) and one chunk's compiled
    step (`unsloth_chunk_bytes`); chunks are a multiple of 4 sized so one chunk's fp32 logits
    stay under `loss_target_bytes` (:140-174).
    Compiled (`setup.compile` and the loss in the stack's `loss_compiled`): inductor's
    partitioner keeps the cross-entropy's input logits in their own dtype and an amax and a
    log-sum-exp per row, not the fp32 log-softmax, and the backward writes the gradient in the
    logits' dtype (torch 2.13 torch/_inductor/decomposition.py select_decomp_table with
    torch/_functorch/partitioners.py min_cut_rematerialization_partition; `bench/compile_saved.py
    --loss` lists them): full = held logits + their gradient; torchtune's chunks = every chunk's
    logits + one chunk's gradient.
    Profiles may replace full and chunked by the seed's hand rules."""
    vocab, hidden = shape
    logit_dtype, hidden_dtype = dtypes
    per_logit = rule.per_logit
    grad_hidden = tokens * hidden * hidden_dtype
    loss = rule.loss
    compiled = rule.compiled
    rows = tokens * 2 * FP32  # compiled cross-entropy: amax and log-sum-exp per row
    if loss == "full":
        if rule.preference_logits:
            return preference_full_logits_bytes(rule, tokens, vocab)
        if compiled:
            return tokens * vocab * 2 * logit_dtype + rows
        return tokens * vocab * per_logit
    if loss == "chunked":
        fixed_chunked = rule.fixed_chunked
        if fixed_chunked:
            return tokens * 0 + fixed_chunked
        chunk = chunk_positions(rule, tokens, seq)
        if compiled and rule.num_chunks:
            # every chunk's logits kept in their own dtype, one chunk's gradient
            return (tokens + chunk) * vocab * logit_dtype + rows + grad_hidden
        if compiled:
            return chunk * vocab * 2 * logit_dtype + rows + grad_hidden
        if rule.vocab_tile:
            return trl_logprob_bytes(rule, tokens, seq, shape, dtypes)
        if rule.num_chunks:
            return chunked_output_loss_bytes(tokens, chunk, vocab, logit_dtype, grad_hidden)
        head = FP32 * vocab * hidden if rule.upcasts_head else 0
        return chunk * vocab * per_logit + head + grad_hidden
    if loss == "liger":
        chunk = np.minimum(_next_pow2(np.ceil(tokens / np.ceil(vocab / hidden))), tokens)
        return grad_hidden + chunk * vocab * hidden_dtype + tokens * FP32
    if loss == "cce":
        return grad_hidden + tokens * FP32
    return grad_hidden + unsloth_chunk_bytes(tokens, vocab, hidden, dtypes, rule.target)


def unsloth_chunk_bytes(
    tokens: Any, vocab: int, hidden: int, dtypes: tuple[int, int], target: float
) -> Any:
    """One chunk of Unsloth's fused cross-entropy, compiled. unsloth_zoo (main ce232d6c)
    fused_losses/cross_entropy_loss.py:350-356 `torch.compile`s the chunk step
    (`accumulate_chunk`: grad_and_value of lm_head matmul + `.float()` + cross-entropy, :260-345)
    whenever asked, and unsloth's causal-LM forward asks (unsloth main 015bdef0d9
    models/llama.py:1497-1508 `torch_compile = True`). Inductor's plan of that step
    (`bench/unsloth_ce_compiled.py`, torch 2.13): the chunk's logits in the head's dtype,
    overwritten in place by their gradient (the fp32 upcast, log-softmax and gradient are fused,
    never stored), three fp32 values per row, and the chunk's hidden-state gradient. Eager (the
    fallback when that compile raises) would hold 12-16 bytes per logit; not modelled.
    Chunk positions: the chunk count is a multiple of 4 keeping one chunk's fp32 logits under
    the target (:140-174), so a chunk's logits saw-tooth below target / 4 bytes per logit and
    tend to it; the envelope min(all positions, target / (vocab x 4)) is used (exact at the
    target, and keeps memory monotone)."""
    logit_dtype, hidden_dtype = dtypes
    chunk = np.minimum(tokens, target / (vocab * FP32))
    return chunk * (vocab * logit_dtype + 3 * FP32 + hidden * hidden_dtype)
