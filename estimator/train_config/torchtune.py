"""torchtune recipe YAML (`tune run <recipe> --config file.yaml`).

Keys read from torchtune bd2a0fc7 (2026-04-23) `recipes/configs/**` and the recipes:
`model._component_` (a model builder: `torchtune.models.<family>.[q]lora_<name>` or `<name>`),
`model.lora_attn_modules`, `apply_lora_to_mlp`, `apply_lora_to_output`, `lora_rank`,
`lora_alpha`, `lora_dropout`; `tokenizer.max_seq_len`; `batch_size`;
`gradient_accumulation_steps`; `optimizer._component_` (+ `fused`); `optimizer_in_bwd`
(recipes/full_finetune_distributed.py:208); `loss._component_`
(`CEWithChunkedOutputLoss` / `LinearCrossEntropyLoss`, `num_output_chunks` default 8:
torchtune/modules/loss/ce_chunked_output_loss.py:35, cross_entropy_loss.py:36);
`enable_activation_checkpointing`, `enable_activation_offloading`, `ac_mode` (selective,
full_finetune_distributed.py:384); `fsdp_cpu_offload` (:145) and `fsdp_reshard_after_forward`
(the class docstring: False = SHARD_GRAD_OP); `dtype`; `compile`;
`dataset.packed`; `epochs`; `checkpointer.checkpoint_dir`.
torchtune trains in `dtype` directly (no autocast, no fp32 master weights).

Builder -> model: the Hub repo that each builder's recipe configs download (the `tune download`
line at the top of e.g. recipes/configs/llama3_2/1B_lora.yaml) or its docstring names, or a
trainfit preset of it (`BUILDER_MODELS`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from estimator.errors import EstimatorInputError
from estimator.parallel.layout import SEPARATE_UNITS
from estimator.train_config.evaluation import set_eval_batch
from estimator.train_config.result import TrainConfigMapping, whole_number
from estimator.train_config.sharding import set_layout, set_offload
from estimator.train_config.vocab import COMPONENT_OPTIMIZERS, model_ref

BUILDER = re.compile(r"^torchtune\.models\.[a-z0-9_]+\.(?P<kind>q?lora_)?(?P<name>[a-z0-9_]+)$")
# Builder -> the Hub repo its docstring names ("from https://huggingface.co/...", torchtune
# bd2a0fc7 torchtune/models/<family>/_model_builders.py), or a trainfit preset of that repo. Two
# docstrings are wrong and the repo the recipe configs download is used: qwen3_14b_base names
# Qwen/Qwen3-14B and qwen3_14b_instruct the non-existent Qwen/Qwen3-14B-Instruct
# (recipes/configs/qwen3/14B_lora_single_device.yaml downloads Qwen/Qwen3-14B for the latter).
# A preset stands for an instruct repo where the builder's shape is its base model's (the
# builder takes no instruct-only field): llama3_1_8b, llama3_2_1b/3b, qwen2_5_3b.
BUILDER_MODELS = {
    "llama3_1_8b": "llama-3.1-8b",
    "llama3_1_70b": "llama-3.1-70b",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B-Instruct",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama3_2_1b": "llama-3.2-1b",
    "llama3_2_3b": "llama-3.2-3b",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct",
    "llama4_scout_17b_16e": "llama-4-scout",
    "llama4_maverick_17b_128e": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "llama2_7b": "meta-llama/Llama-2-7b-hf",
    "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "mistral_7b": "mistral-7b",
    "gemma_2b": "google/gemma-2b",
    "gemma_7b": "google/gemma-7b",
    "gemma2_2b": "google/gemma-2-2b",
    "gemma2_9b": "google/gemma-2-9b",
    "gemma2_27b": "google/gemma-2-27b",
    "qwen2_0_5b": "Qwen/Qwen2-0.5B-Instruct",
    "qwen2_1_5b": "Qwen/Qwen2-1.5B-Instruct",
    "qwen2_7b": "Qwen/Qwen2-7B-Instruct",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_1_5b_instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2_5_3b": "qwen2.5-3b",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B",
    "qwen2_5_7b_instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2_5_14b_base": "Qwen/Qwen2.5-14B",
    "qwen2_5_14b_instruct": "Qwen/Qwen2.5-14B-Instruct",
    "qwen2_5_32b_base": "Qwen/Qwen2.5-32B",
    "qwen2_5_32b_instruct": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2_5_72b_base": "Qwen/Qwen2.5-72B",
    "qwen2_5_72b_instruct": "Qwen/Qwen2.5-72B-Instruct",
    "qwen3_0_6b_base": "Qwen/Qwen3-0.6B-Base",
    "qwen3_0_6b_instruct": "Qwen/Qwen3-0.6B",
    "qwen3_1_7b_base": "Qwen/Qwen3-1.7B-Base",
    "qwen3_1_7b_instruct": "Qwen/Qwen3-1.7B",
    "qwen3_4b_base": "Qwen/Qwen3-4B-Base",
    "qwen3_4b_instruct": "Qwen/Qwen3-4B",
    "qwen3_8b_base": "Qwen/Qwen3-8B-Base",
    "qwen3_8b_instruct": "qwen3-8b",
    "qwen3_14b_base": "Qwen/Qwen3-14B-Base",
    "qwen3_14b_instruct": "Qwen/Qwen3-14B",
    "qwen3_32b": "qwen3-32b",
    "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi4_14b": "microsoft/phi-4",
}
LOSSES = {
    "torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked",
    "torchtune.modules.loss.LinearCrossEntropyLoss": "chunked",
    "torch.nn.CrossEntropyLoss": "full",
}
DEFAULT_LOSS_CHUNKS = 8  # num_output_chunks default, see module docstring
# torchtune main's LinearCrossEntropyLoss (bd2a0fc7c modules/loss/cross_entropy_loss.py:18-142)
# is in no release: 0.6.1 (2025-04-07) is the last on PyPI and has CEWithChunkedOutputLoss only.
# Its bytes differ: the model skips its output layer (`set_model_output`, skip_output_layer) and
# each chunk's logits are made inside the loss (`compute_cross_entropy`: linear_projection of the
# chunk, `F.cross_entropy(logits.float(), ...)`), so only the fp32 log-softmax outputs are saved,
# not every chunk's bf16 logits as 0.6.1's `chunked_output` list holds them
# (memory/logits.py `chunked_output_loss_bytes`). Estimated as 0.6.1's loss, said so.
UNRELEASED_LOSS = (
    "torchtune.modules.loss.LinearCrossEntropyLoss is on torchtune main only (no release has "
    "it; 0.6.1 is the last): estimated as 0.6.1's CEWithChunkedOutputLoss, which also holds "
    "every chunk's bf16 logits at the loss (tokens x vocab x 2 bytes more than main's loss)"
)
DTYPES = {"bf16": "bf16", "fp32": "fp32", "bfloat16": "bf16", "float32": "fp32"}


def read_torchtune(data: dict[str, Any], base_dir: Path | None) -> TrainConfigMapping:
    m = TrainConfigMapping("torchtune")
    m.set("stack", "torchtune", "(torchtune recipe)")
    if "optimizer" not in data and "loss" not in data:
        # every training config of recipes/configs has an optimizer; the eleuther_eval,
        # generate and quantize recipes' configs (e.g. llama3_1/evaluation.yaml) have neither
        m.warnings.append(
            "optimizer, loss: neither is set, as in torchtune's evaluation, generation and "
            "quantization configs; this estimate is of a training step with the recipe defaults"
        )
    model = m.get(data, "model") or {}
    _model(m, model if isinstance(model, dict) else {}, data, base_dir)
    tokenizer = m.get(data, "tokenizer") or {}
    length = tokenizer.get("max_seq_len") if isinstance(tokenizer, dict) else None
    m.read.add("tokenizer.max_seq_len")
    if length is not None:
        m.seq_lens = [whole_number(length, "tokenizer.max_seq_len")]
        m.origin["seq_lens"] = "tokenizer.max_seq_len"
    else:
        m.warnings.append("tokenizer.max_seq_len: null, so rows are as long as the longest sample")
    m.set("batch", m.get(data, "batch_size"), "batch_size")
    m.set("grad_accum", m.get(data, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    m.set_run("epochs", m.get(data, "epochs"), "epochs")
    _optimizer(m, data)
    _loss(m, data)
    _checkpointing(m, data)
    dtype = m.get(data, "dtype")
    if dtype is not None:
        if str(dtype) in DTYPES:
            m.set("precision", DTYPES[str(dtype)], "dtype")
            m.set("autocast", False, "dtype")
        else:
            m.ignore("dtype", f"dtype {dtype!r} is not modelled (bf16/fp32 are)")
    compiled = m.get(data, "compile")
    if compiled is not None:
        m.set("compile", bool(compiled), "compile")
    _fsdp(m, data)
    _model_parallel(m, data)
    _validation(m, data)
    dataset = m.get(data, "dataset")
    if isinstance(dataset, dict) and dataset.get("packed"):
        m.set_run("packing", True, "dataset.packed")
        m.set_run("packing_strategy", "greedy", "dataset.packed")
    m.read.add("dataset.packed")
    for key in (
        "checkpointer",
        "output_dir",
        "device",
        "seed",
        "shuffle",
        "max_steps_per_epoch",
        "log_peak_memory_stats",
        "resume_from_checkpoint",
        "save_adapter_weights_only",
    ):
        m.get(data, key)
    # recipes qat_*.py: Int8DynActInt4WeightQATQuantizer fake-quantizes weights and activations
    # in every Linear's forward; knowledge_distillation_*.py loads a second, teacher model
    if m.get(data, "quantizer"):
        m.ignore("quantizer", "QAT's fake-quantized weight and activation copies are not modelled")
    teacher = m.get(data, "teacher_model"), m.get(data, "teacher_checkpointer")
    if any(teacher):
        m.ignore(
            "teacher_model",
            "knowledge distillation: the teacher model's weights and logits are not counted "
            "(an underestimate)",
        )
    m.get(data, "kd_loss")
    m.get(data, "kd_ratio")
    _other_models(m, data)
    m.warn_unread(data)
    return m


# checkpointers of the models a preference / RL recipe loads besides the policy: a reference
# (recipes/full_dpo_distributed.py:215-222, 279; dev/grpo_full_finetune_distributed.py:147),
# PPO's reference policy, value and reward models (ppo_full_finetune_single_device.py:165-172)
OTHER_MODELS = (
    "ref_checkpointer",
    "ref_policy_checkpointer",
    "value_checkpointer",
    "reward_checkpointer",
)


def _other_models(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """The other models of a DPO / PPO / GRPO recipe, reported (estimated as SFT of the policy:
    the ignored loss component says so), with PPO's batch keys."""
    loaded = [key for key in OTHER_MODELS if m.get(data, key)]
    if loaded:
        m.ignore(
            loaded[0],
            f"the recipe loads {len(loaded)} more model(s) ({', '.join(loaded)}): their weights "
            "and forward passes are not counted (an underestimate)",
        )
    for key in ("ppo_batch_size", "forward_batch_size", "min_response_length"):
        m.get(data, key)


def _model(
    m: TrainConfigMapping, model: dict[str, Any], data: dict[str, Any], base_dir: Path | None
) -> None:
    component = str(model.get("_component_", ""))
    match = BUILDER.match(component)
    checkpointer = data.get("checkpointer")
    checkpoint_dir = checkpointer.get("checkpoint_dir") if isinstance(checkpointer, dict) else None
    local = base_dir is not None  # a config sent to the service names no file we read
    if local and checkpoint_dir and Path(str(checkpoint_dir), "config.json").is_file():
        m.model = model_ref(str(checkpoint_dir), base_dir)
        m.origin["model"] = "checkpointer.checkpoint_dir"
    elif match and match["name"] in BUILDER_MODELS:
        m.model = model_ref(BUILDER_MODELS[match["name"]])
        m.origin["model"] = "model._component_"
    else:
        m.warnings.append(
            f"model._component_: {component!r} is not a builder trainfit knows; give --model"
        )
    kind = match["kind"] if match else None
    m.set(
        "method", {"lora_": "lora", "qlora_": "qlora"}.get(kind or "", "full"), "model._component_"
    )
    if kind:
        listed = model.get("lora_attn_modules") or []
        if not isinstance(listed, list):
            raise EstimatorInputError(
                "train_config.model.lora_attn_modules", f"expected a list, got {listed!r}"
            )
        targets = [str(t) for t in listed]
        if model.get("apply_lora_to_mlp"):
            targets += ["w1", "w2", "w3"]  # torchtune's FeedForward projections
        if model.get("apply_lora_to_output"):
            targets.append("output")
        m.set("lora_targets", _hf_names(targets) or None, "model.lora_attn_modules")
        m.set("lora_rank", model.get("lora_rank"), "model.lora_rank")
        m.set("lora_alpha", model.get("lora_alpha"), "model.lora_alpha")
        m.set("lora_dropout", model.get("lora_dropout", 0.0), "model.lora_dropout")
        if kind == "qlora_":
            # torchtune's NF4 (torchao NF4Tensor) quantizes the scales too (double quantization)
            m.set("double_quant", True, "model._component_")
    for key in (
        "_component_",
        "lora_attn_modules",
        "apply_lora_to_mlp",
        "apply_lora_to_output",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
    ):
        m.read.add(f"model.{key}")
    m.warn_unread(model, "model.")


# torchtune module names -> the transformers names trainfit's LoRA targets use
TT_TO_HF = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "output": "lm_head",
}


def _hf_names(names: list[str]) -> list[str]:
    return [TT_TO_HF.get(n, n) for n in names]


def _component(m: TrainConfigMapping, data: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """A `key: {_component_: dotted.name, ...}` section and its component name ("" if none)."""
    section = m.get(data, key)
    if not isinstance(section, dict):
        return {}, ""
    return section, str(section.get("_component_", ""))


def _optimizer(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    opt, component = _component(m, data, "optimizer")
    fields = COMPONENT_OPTIMIZERS.get(component)
    if fields is None:
        if component:
            m.ignore("optimizer._component_", f"optimizer {component!r} is not modelled")
    else:
        for name, value in fields.items():
            m.set(name, value, "optimizer._component_")
        if component.startswith("torch.optim."):
            impl = "fused" if opt.get("fused") else "foreach"
            m.set("optimizer_impl", impl, "optimizer.fused")
    if m.get(data, "optimizer_in_bwd"):
        m.set("optimizer_impl", "in-backward", "optimizer_in_bwd")


def _loss(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    loss, component = _component(m, data, "loss")
    kind = LOSSES.get(component)
    if kind is None:
        if component:
            m.ignore("loss._component_", f"loss {component!r} is not modelled")
        return
    m.set("loss", kind, "loss._component_")
    if component.endswith(".LinearCrossEntropyLoss"):
        m.warnings.append(f"loss._component_: {UNRELEASED_LOSS}")
    if kind == "chunked" and m.seq_lens:
        chunks = whole_number(
            loss.get("num_output_chunks", DEFAULT_LOSS_CHUNKS), "loss.num_output_chunks"
        )
        m.set("loss_chunk", -(-m.seq_lens[0] // chunks), "loss.num_output_chunks")


def _fsdp(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """The distributed recipes' keys (full_finetune_distributed.py / lora_finetune_distributed.py
    class docstrings): they shard with FSDP2 `fully_shard`; `fsdp_reshard_after_forward: False`
    is the SHARD_GRAD_OP behaviour; `fsdp_cpu_offload` moves params, grads and states to the CPU.
    Single-device recipe configs have neither key."""
    reshard = m.get(data, "fsdp_reshard_after_forward")
    offload = m.get(data, "fsdp_cpu_offload")
    if "fsdp_cpu_offload" in data or reshard is not None:
        key = "fsdp_reshard_after_forward" if reshard is not None else "fsdp_cpu_offload"
        keep = reshard is not False
        set_layout(m, "fsdp" if keep else "zero2", "fsdp", key, reshard=keep)
    if offload:
        set_offload(m, "params", "fsdp_cpu_offload")  # CPUOffloadPolicy: params, grads, states
    _custom_sharded_layers(m, data)


def _model_parallel(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """The device mesh of the distributed recipes. 0.6.1 builds (dp, tp) from
    `tensor_parallel_dim` and requires `tensor_parallel_plan` with it (v0.6.1
    recipes/full_finetune_distributed.py:149-166, 545-561); main (bd2a0fc7 :156-179) adds
    `context_parallel_dim` and the data dims `data_parallel_shard_dim` (-1: the GPUs left) and
    `data_parallel_replicate_dim` (HSDP replicas), and its LoRA recipe refuses tensor
    parallelism (lora_finetune_distributed.py:157-160). The plan's output layer is
    `ColwiseParallel(output_layouts=Replicate())` (torchtune/models/llama3/_parallelism.py
    `_get_base_llama_tp_training_plan`): every tp rank holds its batch's whole logits, where
    trainfit's `tp` is torchtitan's vocab-split loss parallel, so tensor parallelism is
    reported, not mapped: the estimate shards with FSDP over every GPU (same parameter share,
    activations not split by tp: an overestimate). Context parallelism and the data dims
    become the layout's `cp=N`, `fsdp[=N]` and `dp=N` items."""
    plan = m.get(data, "tensor_parallel_plan")
    tp = m.count(data, "tensor_parallel_dim")
    if tp > 1:
        if m.setup.get("method") in ("lora", "qlora"):
            raise EstimatorInputError(
                "train_config.tensor_parallel_dim",
                f"{tp}: torchtune's LoRA recipes do not support tensor parallelism "
                "(lora_finetune_distributed.py asserts tensor_parallel_dim == 1)",
            )
        if plan is None:
            raise EstimatorInputError(
                "train_config.tensor_parallel_plan",
                f"tensor_parallel_dim is {tp} and no plan is given (the recipe raises "
                "'Tensor Parallel plan needs to be provided')",
            )
        m.ignore(
            "tensor_parallel_dim",
            f"tensor parallelism over {tp} GPUs (torchtune's plan replicates the logits on "
            "every tp rank) is not modelled: estimated as FSDP over every GPU, which does not "
            "split activations by tp (an overestimate)",
        )
    cp = m.count(data, "context_parallel_dim")
    shard = m.count(data, "data_parallel_shard_dim", -1)
    replicate = m.count(data, "data_parallel_replicate_dim")
    if cp == 1 and shard == -1 and replicate == 1:
        return
    data_kind = "zero2" if m.setup.get("sharding") == "zero2" else "fsdp"
    items = [f"cp={cp}"] * (cp > 1) + [data_kind if shard == -1 else f"{data_kind}={shard}"]
    items += [f"dp={replicate}"] * (replicate > 1)
    keys = ("context_parallel_dim", "data_parallel_shard_dim", "data_parallel_replicate_dim")
    m.set("parallel", ",".join(items), " + ".join(k for k in keys if k in data))


def _validation(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """main's validation (not in 0.6.1): with `dataset_val` and `run_val_every_n_steps` set,
    every N steps a `torch.no_grad()` forward over batches of `batch_size_val` rows (default
    `batch_size`; full_finetune_distributed.py:451-461, 873-890), as `eval_batch`
    (`estimator.train_config.evaluation`)."""
    size = m.get(data, "batch_size_val")
    every = m.get(data, "run_val_every_n_steps")
    if every is None or m.get(data, "dataset_val") is None:
        return
    if size is None or str(size).replace(" ", "") == "${batch_size}":
        size = m.setup.get("batch", 1)
    set_eval_batch(m, size, "batch_size_val")


def _custom_sharded_layers(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    """`custom_sharded_layers: ['tok_embeddings', 'output']` (the 70B/405B full configs): each
    named module becomes an FSDP2 unit of its own (full_finetune_distributed.py@30b8519e8
    :416-417 adds `lambda n, m: n in custom_sharded_layers` to the shard conditions), which is
    `fsdp_wrap` `layer+embeddings+lm_head`; other names are ignored, said so."""
    names = m.get(data, "custom_sharded_layers")
    if not names:
        return
    items = names if isinstance(names, list) else [names]
    units = sorted({SEPARATE_UNITS[str(n)] for n in items if str(n) in SEPARATE_UNITS})
    for other in (str(n) for n in items if str(n) not in SEPARATE_UNITS):
        m.ignore(
            f"custom_sharded_layers:{other}",
            "only the embedding and the output layer are modelled as FSDP units of their own",
        )
    if units:
        m.set("fsdp_wrap", "+".join(["layer", *units]), "custom_sharded_layers")


def _checkpointing(m: TrainConfigMapping, data: dict[str, Any]) -> None:
    on = m.get(data, "enable_activation_checkpointing")
    if on is not None:
        m.set("checkpointing", "gpu" if on else "none", "enable_activation_checkpointing")
    if on and m.get(data, "ac_mode") == "selective":
        m.set("checkpointing", "selective", "ac_mode")
    m.get(data, "ac_option")
    if m.get(data, "enable_activation_offloading"):
        m.set("checkpointing", "offload", "enable_activation_offloading")
