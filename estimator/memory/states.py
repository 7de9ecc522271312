"""`trainable_states`: trainable weights (adapters), their gradients, fp32 masters and the
optimizer's states."""

from __future__ import annotations

from dataclasses import dataclass

from estimator.dtypes import BF16, FP32, INT8
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params, lora_targets
from estimator.setup import TrainingSetup
from estimator.spec import ModelSpec

# bitsandbytes 8-bit optimizers: blockwise quantization, one fp32 absmax per 256 values
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; bnb `optim/optimizer.py`).
ADAM8BIT_BLOCK = 256


@dataclass(frozen=True)
class StateBytes:
    """Bytes of each part of the trainable state (before sharding)."""

    trainable_params: int
    weights: float  # adapters' own weights (LoRA); 0 for full fine-tuning (they are `weights`)
    grads: float
    masters: float
    optimizer: float

    step_transient: float = 0.0  # temporaries of optimizer.step()

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


def optimizer_bytes(spec: ModelSpec, setup: TrainingSetup, params: int, state_bytes: int) -> float:
    """Optimizer state per trainable parameter.
    adamw: two moments (Loshchilov & Hutter 2019; torch.optim.AdamW keeps them in the param's
    dtype, fp32 for fp32 masters/adapters). adamw-8bit: two int8 moments + fp32 absmax per 256.
    sgd: none. sgd-momentum, lion (Chen et al. 2023): one moment. adafactor (Shazeer & Stern 2018,
    torch.optim.Adafactor, beta1=None): factored second moment, rows + cols per matrix."""
    opt = setup.optimizer
    if opt == "adamw":
        return params * 2 * state_bytes
    if opt == "adamw-8bit":
        return params * 2 * (INT8 + FP32 / ADAM8BIT_BLOCK)
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


def largest_tensor(spec: ModelSpec) -> int:
    """Elements of the largest weight tensor (an expert bank is one fused 3-D tensor)."""
    sizes = [lin.experts * lin.in_features * lin.out_features for lin in spec.linears]
    sizes += [g.params for g in spec.others if g.name == "embed_tokens"]
    return max(sizes or [0])  # params-only: unknown shapes, no per-tensor temporaries counted


def step_transient_bytes(
    setup: TrainingSetup, params: int, state_bytes: int, largest: int
) -> float:
    """Temporaries of `optimizer.step()`. torch's multi-tensor AdamW (`_multi_tensor_adamw`,
    the default on CUDA) allocates `exp_avg_sq.sqrt()` for the whole group: one state-sized
    buffer; Adafactor and Lion likewise one. Mixed precision with fp32 masters steps one tensor
    at a time (probe.optim.MasterWeights, as DeepSpeed's bf16 optimizer does per partition):
    the upcast gradient and the sqrt buffer of the largest tensor. bitsandbytes' 8-bit Adam is a
    fused kernel and SGD's updates are in place: none."""
    if setup.precision == "mixed" and not setup.is_adapter:
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
    fp32), gradients in the same dtype, no master."""
    if setup.is_adapter:
        params = lora_params(spec, setup)
        own = FP32 if setup.adapter_dtype == "fp32" or setup.precision == "fp32" else BF16
        return StateBytes(
            params,
            params * own,
            params * own,
            0.0,
            optimizer_bytes(spec, setup, params, own),
            step_transient_bytes(setup, params, own, params),
        )
    params = spec.params_total
    if setup.precision == "mixed":
        grads, masters, state = BF16, FP32, FP32
    elif setup.precision == "bf16":
        grads, masters, state = BF16, 0, BF16
    else:
        grads, masters, state = FP32, 0, FP32
    opt = optimizer_bytes(spec, setup, params, state)
    return StateBytes(
        params,
        0.0,
        params * grads,
        params * masters,
        opt,
        step_transient_bytes(setup, params, state, largest_tensor(spec)),
    )
