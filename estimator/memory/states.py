"""`trainable_states`: trainable weights (adapters), their gradients, fp32 masters and the
optimizer's states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from estimator.dtypes import BF16, FP32, INT8
from estimator.errors import EstimatorInputError
from estimator.lora import expert_adapter_tensors, lora_params, lora_targets
from estimator.memory.weights import MIN_BLOCK, amp_full, kbit_fp32
from estimator.spec import ModelSpec
from estimator.stacks import load_stack

if TYPE_CHECKING:
    from estimator.setup import TrainingSetup

# bitsandbytes 8-bit optimizers: blockwise quantization, one fp32 absmax per 256 values
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; bnb `optim/optimizer.py`).
ADAM8BIT_BLOCK = 256
# bitsandbytes 0.50.2 optim/optimizer.py:383: a paged optimizer pages only the states of
# tensors with at least 1e5 elements (get_state_buffer); smaller ones stay in torch's allocator.
PAGED_MIN_ELEMENTS = 100_000
# bitsandbytes 0.50.2 optim/optimizer.py:502-503 (Optimizer2State.init_state; Optimizer1State
# :674-675): `if p.numel() < config["min_8bit_size"]: dtype = torch.float32`, default 4096
# (:414): a tensor of fewer values gets two fp32 states, not 8-bit ones. torchao's AdamW8bit
# has the same threshold (torchao 0.11.0 optim/adam.py:66-69, "follow bitsandbytes", plus
# numel % block_size == 0; its fallback `torch.zeros_like(p)` is in the param's dtype).
MIN_8BIT_SIZE = 4096
# torchao's AdamW4bit (Li et al. 2023, "Memory Efficient Optimizers with 4-bit States",
# arXiv:2309.01507; transformers' `adamw_torch_4bit`): each moment of a tensor of at least
# MIN_8BIT_SIZE values, a multiple of the block, is an OptimState4bit of `codes` (two 4-bit
# codes per uint8: n/2 bytes), one fp32 `scale` per block of 128 values and its own 16-entry
# fp32 `qmap` (torchao 0.11.0 optim/subclass_4bit.py:87-94 `zeros`; optim/adam.py:329
# block_size=128); any other tensor's moments are `torch.zeros_like(p)`, the param's dtype
# (adam.py:66-70 `_new_buffer`). Its `step` is a CPU tensor (adam.py:112).
ADAM4BIT_BLOCK = 128
ADAM4BIT_CODE = 0.5  # bytes per value
QMAP_VALUES = 16


@dataclass(frozen=True)
class StateBytes:
    """Bytes of each part of the trainable state (before sharding)."""

    trainable_params: int
    weights: float  # adapters' own weights (LoRA); 0 for full fine-tuning (they are `weights`)
    grads: float
    masters: float
    optimizer: float

    step_transient: float = 0.0  # temporaries of optimizer.step()
    paged: float = 0.0  # optimizer states in bitsandbytes' paged (managed) memory, not torch's

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.masters + self.optimizer


def _matrix_shapes(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of every trainable 2-D weight, for Adafactor's factored moments."""
    if setup.is_adapter:
        r = setup.lora_rank
        shapes = []
        for t in lora_targets(spec, setup):
            shapes += [(r, t.in_features, t.count), (t.out_features, r, t.count)]
        return shapes
    return [(lin.out_features, lin.in_features, lin.count * lin.experts) for lin in spec.linears]


def optimizer_bytes(
    spec: ModelSpec,
    setup: TrainingSetup,
    params: int,
    state_bytes: int,
    embed: int = 0,
    small: int = 0,
) -> float:
    """Optimizer state per trainable parameter.
    adamw: two moments (Loshchilov & Hutter 2019; torch.optim.AdamW keeps them in the param's
    dtype, fp32 for fp32 masters/adapters). adamw-4bit (torchao): two 4-bit moments + an fp32
    scale per 128, but the `small` params' (`unquantized_4bit_params`) in the param's dtype.
    adamw-8bit: two int8 moments + fp32 absmax per 256,
    but two fp32 moments for `embed` (see trained_embedding_params) and for the `small` params
    in tensors under MIN_8BIT_SIZE values (`small_tensor_params`). sgd: none.
    sgd-momentum, lion (Chen et al. 2023): one moment. adafactor (Shazeer & Stern 2018,
    torch.optim.Adafactor, beta1=None): factored second moment, rows + cols per matrix."""
    opt = setup.optimizer
    if opt == "adamw":
        return params * 2 * state_bytes
    if opt == "adamw-8bit":  # `embed` of the params: nn.Embedding weights kept at 32 bits
        if not load_stack(setup.stack).get("embeddings_32bit_under_8bit_adam"):
            embed = 0
        wide = embed + min(small, params - embed)
        return (params - wide) * 2 * (INT8 + FP32 / ADAM8BIT_BLOCK) + wide * 2 * FP32
    if opt == "adamw-4bit":
        kept = min(small, params)  # `small`: params in tensors torchao leaves unquantized
        quantized = (params - kept) * 2 * (ADAM4BIT_CODE + FP32 / ADAM4BIT_BLOCK)
        return quantized + kept * 2 * state_bytes
    if opt == "sgd":
        return 0.0
    if opt in ("sgd-momentum", "lion"):
        return params * state_bytes
    # adafactor
    if not spec.geometry_known:
        raise EstimatorInputError(
            "setup.optimizer", "adafactor's factored states need the weight shapes: give a config"
        )
    matrices = _matrix_shapes(spec, setup)
    in_matrices = sum(rows * cols * n for rows, cols, n in matrices)
    factored = sum((rows + cols) * n for rows, cols, n in matrices)
    vectors = max(params - in_matrices, 0)
    return (factored + vectors) * state_bytes


def small_tensor_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Trainable parameters in tensors of fewer than MIN_8BIT_SIZE values, which the 8-bit
    optimizers keep at 32 bits (`state_tensor_sizes` says which tensors are counted). 0
    without the shapes (a params-only spec)."""
    return sum(n for size, n in state_tensor_sizes(spec, setup) if size < MIN_8BIT_SIZE)


def unquantized_4bit_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Trainable parameters whose moments torchao's AdamW4bit keeps unquantized: tensors of
    fewer than MIN_8BIT_SIZE values or of a size not a multiple of ADAM4BIT_BLOCK (torchao
    0.11.0 optim/adam.py:66-70)."""
    return sum(n for size, n in state_tensor_sizes(spec, setup) if _kept_by_torchao(size))


def _kept_by_torchao(size: int) -> bool:
    return size < MIN_8BIT_SIZE or size % ADAM4BIT_BLOCK != 0


def qmap_bytes(spec: ModelSpec, setup: TrainingSetup) -> float:
    """AdamW4bit's lookup tables: one 16-value fp32 `qmap` per quantized moment, two moments
    per quantized tensor, each its own allocation of one 512-byte block (`MIN_BLOCK`; torchao
    0.11.0 optim/subclass_4bit.py:93). Other optimizers: 0."""
    if setup.optimizer != "adamw-4bit":
        return 0.0
    sizes = state_tensor_sizes(spec, setup)
    tensors = sum(n // size for size, n in sizes if size and not _kept_by_torchao(size))
    tensors += _saved_tensors(spec, setup)
    return float(2 * tensors * max(MIN_BLOCK, QMAP_VALUES * FP32))


def _saved_tensors(spec: ModelSpec, setup: TrainingSetup) -> int:
    """peft's `modules_to_save` copies (`saved_module_params`): the embedding, and an untied
    lm_head."""
    if not saved_module_params(spec, setup):
        return 0
    return 1 if spec.tied_embeddings else 2


def state_tensor_sizes(spec: ModelSpec, setup: TrainingSetup) -> list[tuple[int, int]]:
    """(values in the tensor, parameters in tensors of that size) of the tensors an optimizer
    keeps states for. Adapters: each lora_A (r x in) and lora_B (out x r) apart, the expert
    banks' A (r*E x in) and B (out x r*E) (estimator.lora.expert_adapter_tensors); peft's
    modules_to_save copies (never small) are left out. Full fine-tuning: every Linear weight
    (an expert bank is one tensor) and bias, the norms (the q/k norms head_dim wide, the others
    hidden wide), attention sinks (one per head per layer) and the input embedding; the other
    groups (conv1d, dt, A) are left out (counted as large tensors: a lower bound). Empty
    without the shapes (a params-only spec)."""
    if not spec.geometry_known:
        return []
    sizes: list[tuple[int, int]] = []
    if setup.is_adapter:
        r = setup.lora_rank
        for t in lora_targets(spec, setup):
            sizes += [(r * t.in_features, r * t.in_features * t.count)]
            sizes += [(r * t.out_features, r * t.out_features * t.count)]
        for a, b, count in expert_adapter_tensors(spec, setup):
            sizes += [(a, a * count), (b, b * count)]
        return sizes
    for lin in spec.linears:
        weight = lin.experts * lin.in_features * lin.out_features
        sizes.append((weight, weight * lin.count))
        if lin.bias:
            bias = lin.experts * lin.out_features
            sizes.append((bias, bias * lin.count))
    layers, hidden, head_dim = spec.layers or 0, spec.hidden or 0, spec.head_dim or 0
    for g in spec.others:
        if g.name == "norms":
            qk = min(g.params, 2 * layers * head_dim) if spec.qk_norm else 0
            sizes += [(head_dim, qk), (hidden, g.params - qk)]
        elif g.name == "attention_sinks" and layers:
            sizes.append((g.params // layers, g.params))
        elif g.name == "embed_tokens" and g.params:
            sizes.append((g.params, g.params))
    return [(size, n) for size, n in sizes if n]


def unquantized_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """The `small` argument of `optimizer_bytes`: the parameters whose states the setup's
    quantized optimizer keeps at full width (0 for the others)."""
    if setup.optimizer == "adamw-8bit":
        return small_tensor_params(spec, setup)
    if setup.optimizer == "adamw-4bit":
        return unquantized_4bit_params(spec, setup)
    return 0


def embedding_params(spec: ModelSpec) -> int:
    return sum(g.params for g in spec.others if g.name == "embed_tokens")


def trained_embedding_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Parameters of the trained input embedding (an nn.Embedding): the model's own under full
    fine-tuning, peft's trainable copy under `train_embeddings`. HF Trainer gives these 32-bit
    Adam states under a bitsandbytes 8-bit optimizer (transformers 5.24.0 trainer.py:1328-1338:
    register_module_override(module, 'weight', {'optim_bits': 32}) for every nn.Embedding)."""
    if setup.is_adapter and not setup.train_embeddings:
        return 0
    return embedding_params(spec)


def saved_module_params(spec: ModelSpec, setup: TrainingSetup) -> int:
    """peft `modules_to_save` (here embed_tokens and an untied lm_head): a trainable copy of
    each module, the original kept (peft 0.22.0 utils/other.py:660 ModulesToSaveWrapper)."""
    if not (setup.is_adapter and setup.train_embeddings):
        return 0
    head = (
        0
        if spec.tied_embeddings
        else sum(lin.params for lin in spec.linears if lin.group == "head")
    )
    return embedding_params(spec) + head


def largest_tensor(spec: ModelSpec) -> int:
    """Elements of the largest weight tensor (an expert bank is one fused 3-D tensor)."""
    sizes = [lin.experts * lin.in_features * lin.out_features for lin in spec.linears]
    sizes += [g.params for g in spec.others if g.name == "embed_tokens"]
    return max(sizes or [0])  # params-only: unknown shapes, no per-tensor temporaries counted


def step_transient_bytes(
    setup: TrainingSetup, params: int, state_bytes: int, largest: int
) -> float:
    """Temporaries of `optimizer.step()`. torch's multi-tensor AdamW (`_multi_tensor_adamw`,
    `foreach`) allocates `exp_avg_sq.sqrt()` for the whole group (torch/optim/adam.py:760-790):
    one state-sized buffer; Adafactor and Lion likewise one. `fused` (torch._fused_adamw_,
    torch/optim/adam.py:802-877; DeepSpeed FusedAdam) updates in place: no group-sized buffer.
    `in-backward` (torchtune optimizer_in_bwd: one optimizer per parameter, stepped from its
    gradient hook) allocates at most the largest tensor's. Mixed precision with fp32 masters
    steps one tensor at a time (probe.optim.MasterWeights, as DeepSpeed's bf16 optimizer does
    per partition): the upcast gradient, plus the sqrt buffer unless fused. bitsandbytes' 8-bit
    Adam is a fused kernel and SGD's updates are in place: none, stepped in backward too
    (bitsandbytes 0.50.2 optim/optimizer.py:535-590 Optimizer2State.update_step: the grad and
    param are already contiguous, then one in-place optimizer_update_8bit_blockwise call).
    torchao's AdamW4bit steps each tensor with one compiled kernel, whatever `optimizer_impl`
    says (torchao 0.11.0 optim/adam.py:126-141, `torch.compile(single_param_adam,
    fullgraph=True)`): none either. Evidence on CUDA: torchao's README benchmark (pytorch/ao
    072500ab torchao/optim/README.md, Llama2-7B full BF16 with torchtune on an A100, peak
    allocated) has fused AdamW 51.6, bitsandbytes 8-bit 39.3, ao 4-bit 33.2: each differs from
    fused AdamW by the states' difference alone (18.4 for 4-bit), so no step temporary of its
    largest tensor (32000 x 4096) shows. (Inductor's CPU code for the same step, torch 2.13,
    materialises 26 bytes per value of the tensor: not what the CUDA step holds.)"""
    masters = setup.precision == "mixed" and not setup.is_adapter and not amp_full(setup)
    if setup.optimizer == "adamw-4bit" or (
        setup.optimizer_impl == "fused" and setup.optimizer in ("adamw", "adamw-8bit", "sgd")
    ):
        return FP32 * largest if masters else 0.0
    if setup.optimizer_impl == "in-backward":
        in_place = setup.optimizer == "sgd" or (setup.optimizer == "adamw-8bit" and not masters)
        return 0.0 if in_place else float(min(largest, params) * state_bytes)
    if masters:
        return (
            2.0 * FP32 * largest
            if setup.optimizer in ("adamw", "adafactor", "lion")
            else (FP32 * largest)
        )
    if setup.optimizer in ("adamw", "adafactor", "lion"):
        return float(params * state_bytes)
    return 0.0


def trainable_state_bytes(spec: ModelSpec, setup: TrainingSetup) -> StateBytes:
    """Full fine-tuning, `mixed`: bf16 gradients + fp32 master + fp32 optimizer states — with
    the bf16 weights that is the ZeRO paper's 2 + 2 + 4 + 4 + 4 = 16 bytes/parameter for Adam
    (Rajbhandari et al. 2020, section 3.1). `bf16`: bf16 gradients and states, no master.
    `fp32`: fp32 gradients and states. LoRA/QLoRA: adapters in `adapter_dtype` (peft default
    fp32), gradients in the same dtype, no master. `mixed` under AMP (`amp_full`, the hf stack):
    the weights are fp32, so fp32 gradients and AdamW states and no master: 4 + 4 + 8 bytes per
    parameter beside the 4-byte weights (torch.optim.AdamW keeps its moments in the param's
    dtype, torch/optim/adam.py:178-185 zeros_like(p, memory_format=torch.preserve_format))."""
    if setup.is_adapter:
        adapters = lora_params(spec, setup)
        own = FP32 if setup.adapter_dtype == "fp32" or setup.precision == "fp32" else BF16
        saved = saved_module_params(spec, setup)
        saved_bytes = FP32 if kbit_fp32(setup) or setup.precision == "fp32" else BF16
        params = adapters + saved
        weights = adapters * own + saved * saved_bytes
        state = optimizer_bytes(spec, setup, adapters, own, small=unquantized_params(spec, setup))
        if saved:  # the copies' states follow their dtype (torch AdamW: the param's dtype)
            state += optimizer_bytes(
                spec, setup, saved, saved_bytes, trained_embedding_params(spec, setup)
            )
        largest = max(saved and embedding_params(spec), _largest_adapter(spec, setup))
        return _finish(
            spec,
            setup,
            StateBytes(
                params,
                weights,
                weights,
                0.0,
                state,
                step_transient_bytes(setup, params, own, largest if saved else params),
            ),
            largest,
        )
    params = spec.params_total
    if amp_full(setup):
        grads, masters, state = FP32, 0, FP32
    elif setup.precision == "mixed":
        grads, masters, state = BF16, FP32, FP32
    elif setup.precision == "bf16":
        grads, masters, state = BF16, 0, BF16
    else:
        grads, masters, state = FP32, 0, FP32
    opt = optimizer_bytes(
        spec,
        setup,
        params,
        state,
        trained_embedding_params(spec, setup),
        unquantized_params(spec, setup),
    )
    largest = largest_tensor(spec)
    return _finish(
        spec,
        setup,
        StateBytes(
            params,
            0.0,
            params * grads,
            params * masters,
            opt,
            step_transient_bytes(setup, params, state, largest),
        ),
        largest,
    )


def _largest_adapter(spec: ModelSpec, setup: TrainingSetup) -> int:
    r = setup.lora_rank
    return max([r * max(t.in_features, t.out_features) for t in lora_targets(spec, setup)] or [0])


def _paged_fraction(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Share of the trainable parameters whose states a paged optimizer pages (tensors of at
    least PAGED_MIN_ELEMENTS; LoRA: each lora_A (r x in) and lora_B (out x r) separately)."""
    if setup.is_adapter:
        r = setup.lora_rank
        sizes = []
        for t in lora_targets(spec, setup):
            sizes += [(r * t.in_features, t.count), (r * t.out_features, t.count)]
        sizes.append((saved_module_params(spec, setup), 1))
    else:
        sizes = [
            (lin.in_features * lin.out_features * lin.experts, lin.count) for lin in spec.linears
        ]
        sizes += [(g.params, 1) for g in spec.others if g.name == "embed_tokens"]
    total = sum(n * c for n, c in sizes)
    paged = sum(n * c for n, c in sizes if n >= PAGED_MIN_ELEMENTS)
    return paged / total if total else 1.0


def trained_tensors(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Parameter tensors the optimizer steps. Adapters: lora_A and lora_B per adapted Linear,
    plus peft's `modules_to_save` copies (embedding, untied lm_head). Full fine-tuning: every
    Linear's weight (an expert bank is one tensor) and bias, the RMSNorm weights
    (`norms_per_layer` per layer, q/k norms, the final norm), the embedding, and one tensor per
    other parameter group (a lower bound for groups repeated per layer)."""
    if setup.is_adapter:
        return 2 * sum(t.count for t in lora_targets(spec, setup)) + _saved_tensors(spec, setup)
    linears = sum(lin.count * (2 if lin.bias else 1) for lin in spec.linears)
    layers = spec.layers or 0
    norms = layers * (spec.norms_per_layer + (2 if spec.qk_norm else 0)) + 1
    others = sum(1 for g in spec.others if g.name != "norms")
    return linears + norms + others


def step_tensor_bytes(spec: ModelSpec, setup: TrainingSetup) -> float:
    """torch.optim.AdamW keeps each parameter's `step` count as a 0-dim fp32 tensor on the
    parameter's device when `fused` (or capturable), on the CPU otherwise (torch 2.13
    torch/optim/adam.py:168-176, `_get_scalar_dtype(is_fused=True)` = float32,
    optimizer.py:210-215): one 512-byte allocator block per trained tensor (`MIN_BLOCK`).
    Only torch's AdamW: bitsandbytes' optimizers (8-bit, paged) keep `step` as a Python int.
    Needs the tensor inventory (a config), else 0."""
    if setup.optimizer != "adamw" or setup.optimizer_impl != "fused" or setup.paged:
        return 0.0
    if not spec.geometry_known:
        return 0.0
    return float(trained_tensors(spec, setup) * MIN_BLOCK)


def _finish(spec: ModelSpec, setup: TrainingSetup, s: StateBytes, largest: int) -> StateBytes:
    """Stack effects on the state: `paged` optimizer states live in CUDA managed memory
    (bitsandbytes 0.50.2 functional.py:91-93 get_paged: cudaMallocManaged), outside torch's
    allocator and evictable to the host, so they leave the device figure; `in-backward`
    frees each gradient right after its parameter's step, so only the largest one is alive;
    fused AdamW's per-parameter `step` tensors (`step_tensor_bytes`) are optimizer state."""
    grads, optimizer, paged = s.grads, s.optimizer, 0.0
    if setup.paged and setup.optimizer in ("adamw", "adamw-8bit", "lion"):
        paged = optimizer * (_paged_fraction(spec, setup) if spec.geometry_known else 1.0)
        optimizer -= paged
    if setup.optimizer_impl == "in-backward" and s.trainable_params:
        grads = s.grads * min(largest, s.trainable_params) / s.trainable_params
    optimizer += step_tensor_bytes(spec, setup) + qmap_bytes(spec, setup)
    return StateBytes(
        s.trainable_params, s.weights, grads, s.masters, optimizer, s.step_transient, paged
    )
