"""Every memory-relevant field of issue 14, for every training-config format: a small config
written for this test per (format, field), mapped, and the trainfit value asserted. A last test
checks that each format covers every field, or says why the format has no such key."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from estimator.train_config import map_config, parse_text, read_file

# the fields the issue lists ("maps every memory-relevant key")
FIELDS = (
    "base_model",
    "lora",
    "qlora",
    "load_in_8bit",
    "load_in_4bit",
    "rank",
    "alpha",
    "dropout",
    "targets",
    "modules_to_save",
    "seq_len",
    "micro_batch",
    "grad_accum",
    "optimizer",
    "bf16",
    "fp16",
    "checkpointing",
    "checkpointing_offload",
    "attention",
    "liger",
    "cce",
    "chunked_loss",
    "packing",
    "fsdp",
    "deepspeed",
    "offload",
)

# fields a format has no key for, and why (checked against the projects' option lists)
NOT_IN_FORMAT: dict[str, dict[str, str]] = {
    "llamafactory": {
        "cce": "LLaMA-Factory has no cut-cross-entropy option (hparams/*.py)",
        "chunked_loss": "no chunked-loss option in LLaMA-Factory's hparams",
    },
    "torchtune": {
        "load_in_8bit": "torchtune quantizes only to NF4 (qlora_* builders)",
        "modules_to_save": "torchtune's LoRA builders have no modules_to_save",
        "fp16": "covered as ignored: recipes refuse fp16 (full fp16 training is not supported)",
        "attention": "torchtune picks its own SDPA/flex kernel; no config key",
        "liger": "no Liger option in torchtune recipes",
        "cce": "no cut-cross-entropy option; LinearCrossEntropyLoss (main) is chunked_loss",
        "deepspeed": "torchtune does not run under DeepSpeed",
    },
    "trl": {
        "cce": "transformers/TRL have no cut-cross-entropy option",
    },
}

# (format, field, config text, expected): expected keys are `setup.<name>`, `model`, `seq_lens`,
# `run.<name>`, `ignored` (keys that must be listed) and `warning` (a key a warning must name)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    # -- axolotl ---------------------------------------------------------------------------------
    ("axolotl", "base_model", "base_model: acme/model-x\n", {"model": {"hub": "acme/model-x"}}),
    (
        "axolotl",
        "base_model",  # the preset's source repo at another revision is that revision on the Hub
        "base_model: meta-llama/Llama-3.1-8B\nrevision_of_model: v2\n",
        {"model": {"hub": "meta-llama/Llama-3.1-8B@v2"}},
    ),
    (
        "axolotl",
        "lora",
        "base_model: x/y\nadapter: lora\n",
        {"setup.method": "lora", "setup.lora_dropout": 0.0},
    ),
    (
        "axolotl",
        "qlora",
        "base_model: x/y\nadapter: qlora\nload_in_4bit: true\n",
        {"setup.method": "qlora", "setup.double_quant": True},
    ),
    (
        "axolotl",
        "load_in_8bit",
        "base_model: x/y\nadapter: lora\nload_in_8bit: true\n",
        {"setup.method": "lora", "setup.base": "int8"},
    ),
    (
        "axolotl",
        "load_in_4bit",
        "base_model: x/y\nadapter: lora\nload_in_4bit: true\n",
        {"setup.method": "qlora"},
    ),
    ("axolotl", "rank", "base_model: x/y\nadapter: lora\nlora_r: 8\n", {"setup.lora_rank": 8}),
    (
        "axolotl",
        "alpha",
        "base_model: x/y\nadapter: lora\nlora_alpha: 64\n",
        {"setup.lora_alpha": 64},
    ),
    (
        "axolotl",
        "dropout",
        "base_model: x/y\nadapter: lora\nlora_dropout: 0.1\n",
        {"setup.lora_dropout": 0.1},
    ),
    (
        "axolotl",
        "targets",
        "base_model: x/y\nadapter: lora\nlora_target_modules: [q_proj, v_proj]\n",
        {"setup.lora_targets": ["q_proj", "v_proj"]},
    ),
    (
        "axolotl",
        "targets",
        "base_model: x/y\nadapter: lora\nlora_target_linear: true\n",
        {"setup.lora_targets": ["all-linear"]},
    ),
    (
        "axolotl",
        "modules_to_save",
        "base_model: x/y\nadapter: lora\nlora_modules_to_save: [lm_head]\n",
        {"setup.train_embeddings": True},
    ),
    ("axolotl", "seq_len", "base_model: x/y\nsequence_len: 3000\n", {"seq_lens": [3000]}),
    ("axolotl", "micro_batch", "base_model: x/y\nmicro_batch_size: 3\n", {"setup.batch": 3}),
    (
        "axolotl",
        "grad_accum",
        "base_model: x/y\ngradient_accumulation_steps: 5\n",
        {"setup.grad_accum": 5},
    ),
    (
        "axolotl",
        "optimizer",
        "base_model: x/y\noptimizer: adamw_bnb_8bit\n",
        {"setup.optimizer": "adamw-8bit", "setup.paged": False},
    ),
    (
        "axolotl",
        "optimizer",
        "base_model: x/y\n",  # axolotl's default adamw_torch_fused
        {"setup.optimizer": "adamw", "setup.optimizer_impl": "fused"},
    ),
    (
        "axolotl",
        "optimizer",
        "base_model: x/y\noptimizer: paged_adamw_32bit\n",
        {"setup.optimizer": "adamw", "setup.paged": True},
    ),
    (
        "axolotl",
        "bf16",
        "base_model: x/y\nadapter: lora\nbf16: true\n",
        {"setup.autocast": True, "setup.precision": "mixed", "origin.precision": "bf16"},
    ),
    (  # a full fine-tune keeps the bf16 weights it loaded (test_train_config_axolotl_precision)
        "axolotl",
        "bf16",
        "base_model: x/y\nbf16: true\n",
        {"setup.autocast": True, "setup.precision": "bf16"},
    ),
    (
        "axolotl",
        "fp16",
        "base_model: x/y\nfp16: true\n",
        {"setup.autocast": True, "setup.precision": "mixed", "origin.precision": "fp16"},
    ),
    (
        "axolotl",
        "checkpointing",
        "base_model: x/y\ngradient_checkpointing: false\n",
        {"setup.checkpointing": "none"},
    ),
    (
        "axolotl",
        "checkpointing_offload",
        "base_model: x/y\ngradient_checkpointing: offload\n",
        {"setup.checkpointing": "offload"},
    ),
    (
        "axolotl",
        "checkpointing_offload",
        "base_model: x/y\ngradient_checkpointing: true\nactivation_offloading: true\n",
        {"setup.checkpointing": "offload"},
    ),
    ("axolotl", "attention", "base_model: x/y\nsdp_attention: true\n", {"setup.attention": "sdpa"}),
    (
        "axolotl",
        "attention",
        "base_model: x/y\nattn_implementation: eager\n",
        {"setup.attention": "eager"},
    ),
    (
        "axolotl",
        "attention",  # a Hub kernel transformers registers as flash attention (gpt-oss examples)
        "base_model: x/y\nattn_implementation: kernels-community/vllm-flash-attn3\n",
        {"setup.attention": "flash"},
    ),
    (
        "axolotl",
        "attention",  # another Hub kernel: not modelled, said so
        "base_model: x/y\nattn_implementation: kernels-community/flash-mla\n",
        {"ignored": ["attn_implementation"]},
    ),
    (
        "axolotl",
        "liger",
        "base_model: x/y\nliger_fused_linear_cross_entropy: true\nliger_rms_norm: true\n",
        {"setup.loss": "liger", "ignored": ["liger_rms_norm"]},
    ),
    ("axolotl", "cce", "base_model: x/y\ncut_cross_entropy: true\n", {"setup.loss": "cce"}),
    (
        "axolotl",
        "chunked_loss",
        "base_model: x/y\nsequence_len: 4096\nchunked_cross_entropy: true\n"
        "chunked_cross_entropy_num_chunks: 8\n",
        {"setup.loss": "chunked", "setup.loss_chunk": 512},
    ),
    (
        "axolotl",
        "packing",
        "base_model: x/y\nsample_packing: true\n",
        {"run.packing": True, "run.packing_strategy": "multipack"},
    ),
    (
        "axolotl",
        "fsdp",
        "base_model: x/y\nfsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
        "  offload_params: true\n  activation_checkpointing: true\n",
        {
            "setup.sharding": "fsdp",
            "setup.parallel": "fsdp",
            "setup.checkpointing": "gpu",
            "setup.offload": "params",
        },
    ),
    (
        "axolotl",
        "fsdp",
        "base_model: x/y\nfsdp: [shard_grad_op, auto_wrap]\n",
        {"setup.sharding": "zero2", "setup.parallel": "fsdp", "setup.reshard_after_forward": False},
    ),
    (
        "axolotl",
        "deepspeed",
        "base_model: x/y\ndeepspeed: ds.json\n",
        {"setup.stack": "deepspeed", "setup.sharding": "zero3", "setup.batch": 2},
    ),
    (
        "axolotl",
        "offload",
        "base_model: x/y\ndeepspeed: ds.json\n",
        {"setup.offload": "params", "setup.parallel": "zero3"},
    ),
    # -- LLaMA-Factory ---------------------------------------------------------------------------
    (
        "llamafactory",
        "base_model",
        "model_name_or_path: acme/model-x\nstage: sft\n",
        {"model": {"hub": "acme/model-x"}},
    ),
    (
        "llamafactory",
        "base_model",
        "model_name_or_path: acme/model-x\nmodel_revision: main\nstage: sft\n",
        {"model": {"hub": "acme/model-x"}},
    ),
    (
        "trl",
        "base_model",
        "model_name_or_path: Qwen/Qwen3-8B\nmodel_revision: abc123\nmax_length: 8\n",
        {"model": {"hub": "Qwen/Qwen3-8B@abc123"}},
    ),
    (
        "llamafactory",
        "lora",
        "model_name_or_path: x/y\nfinetuning_type: lora\n",
        {"setup.method": "lora", "setup.lora_rank": 8, "setup.lora_alpha": 16},
    ),
    (
        "llamafactory",
        "qlora",
        "model_name_or_path: x/y\nfinetuning_type: lora\nquantization_bit: 4\n",
        {"setup.method": "qlora", "setup.double_quant": True},
    ),
    (
        "llamafactory",
        "load_in_8bit",
        "model_name_or_path: x/y\nfinetuning_type: lora\nquantization_bit: 8\n",
        {"setup.method": "lora", "setup.base": "int8"},
    ),
    (
        "llamafactory",
        "load_in_4bit",
        "model_name_or_path: x/y\nquantization_bit: 4\ndouble_quantization: false\n",
        {"setup.method": "qlora", "setup.double_quant": False},
    ),
    ("llamafactory", "rank", "model_name_or_path: x/y\nlora_rank: 32\n", {"setup.lora_rank": 32}),
    (
        "llamafactory",
        "alpha",
        "model_name_or_path: x/y\nlora_rank: 32\nlora_alpha: 8\n",
        {"setup.lora_alpha": 8},
    ),
    (
        "llamafactory",
        "dropout",
        "model_name_or_path: x/y\nlora_dropout: 0.05\nstage: sft\n",
        {"setup.lora_dropout": 0.05},
    ),
    (
        "llamafactory",
        "targets",
        "model_name_or_path: x/y\nlora_target: all\n",
        {"setup.lora_targets": ["all-linear"]},
    ),
    (
        "llamafactory",
        "targets",
        "model_name_or_path: x/y\nlora_target: q_proj,v_proj\n",
        {"setup.lora_targets": ["q_proj", "v_proj"]},
    ),
    (
        "llamafactory",
        "modules_to_save",
        "model_name_or_path: x/y\nstage: sft\nadditional_target: embed_tokens,lm_head\n",
        {"setup.train_embeddings": True},
    ),
    (
        "llamafactory",
        "seq_len",
        "model_name_or_path: x/y\ncutoff_len: 1024\n",
        {"seq_lens": [1024]},
    ),
    (
        "llamafactory",
        "micro_batch",
        "model_name_or_path: x/y\nstage: sft\nper_device_train_batch_size: 4\n",
        {"setup.batch": 4},
    ),
    (
        "llamafactory",
        "grad_accum",
        "model_name_or_path: x/y\nstage: sft\ngradient_accumulation_steps: 8\n",
        {"setup.grad_accum": 8},
    ),
    (
        "llamafactory",
        "optimizer",
        "model_name_or_path: x/y\nstage: sft\noptim: paged_adamw_8bit\n",
        {"setup.optimizer": "adamw-8bit", "setup.paged": True},
    ),
    (
        "llamafactory",
        "bf16",
        "model_name_or_path: x/y\nstage: sft\nbf16: true\n",
        {"setup.autocast": True, "origin.precision": "bf16"},
    ),
    (
        "llamafactory",
        "bf16",
        "model_name_or_path: x/y\nstage: sft\npure_bf16: true\n",
        {"setup.autocast": False, "setup.precision": "bf16"},
    ),
    (
        "llamafactory",
        "fp16",
        "model_name_or_path: x/y\nstage: sft\nfp16: true\n",
        {"setup.autocast": True, "origin.precision": "fp16"},
    ),
    (
        "llamafactory",
        "checkpointing",
        "model_name_or_path: x/y\nstage: sft\ndisable_gradient_checkpointing: true\n",
        {"setup.checkpointing": "none"},
    ),
    (
        "llamafactory",
        "checkpointing_offload",
        "model_name_or_path: x/y\nstage: sft\nuse_unsloth_gc: true\n",
        {"setup.checkpointing": "offload"},
    ),
    (
        "llamafactory",
        "attention",
        "model_name_or_path: x/y\nstage: sft\nflash_attn: sdpa\n",
        {"setup.attention": "sdpa"},
    ),
    (
        "llamafactory",
        "liger",
        "model_name_or_path: x/y\nstage: sft\nenable_liger_kernel: true\n",
        {"setup.loss": "liger"},
    ),
    (
        "llamafactory",
        "packing",
        "model_name_or_path: x/y\nstage: sft\nneat_packing: true\n",
        {"run.packing": True},
    ),
    (
        "llamafactory",
        "fsdp",
        "model_name_or_path: x/y\nstage: sft\nfsdp: full_shard auto_wrap offload\n",
        {"setup.sharding": "fsdp", "setup.parallel": "fsdp", "setup.offload": "params"},
    ),
    (
        "llamafactory",
        "deepspeed",
        "model_name_or_path: x/y\nstage: sft\ndeepspeed: ds.json\n",
        {"setup.stack": "deepspeed", "setup.sharding": "zero3"},
    ),
    (
        "llamafactory",
        "offload",
        "model_name_or_path: x/y\nstage: sft\ndeepspeed: ds.json\n",
        {"setup.offload": "params", "setup.parallel": "zero3"},
    ),
    # -- torchtune -------------------------------------------------------------------------------
    (
        "torchtune",
        "base_model",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n",
        {"model": {"preset": "llama-3.2-1b"}, "setup.method": "full"},
    ),
    (
        "torchtune",
        "lora",
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
        "  lora_attn_modules: [q_proj, v_proj]\n",
        {"setup.method": "lora", "setup.lora_targets": ["q_proj", "v_proj"]},
    ),
    (
        "torchtune",
        "qlora",
        "model:\n  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b\n",
        {"setup.method": "qlora", "setup.double_quant": True, "model": {"preset": "llama-3.1-8b"}},
    ),
    (
        "torchtune",
        "load_in_4bit",
        "model:\n  _component_: torchtune.models.qwen2.qlora_qwen2_7b\n",
        {"setup.method": "qlora"},
    ),
    (
        "torchtune",
        "rank",
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 64\n",
        {"setup.lora_rank": 64},
    ),
    (
        "torchtune",
        "alpha",
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_alpha: 128\n",
        {"setup.lora_alpha": 128},
    ),
    (
        "torchtune",
        "dropout",
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_dropout: 0.1\n",
        {"setup.lora_dropout": 0.1},
    ),
    (
        "torchtune",
        "targets",
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
        "  lora_attn_modules: [q_proj, k_proj, v_proj, output_proj]\n  apply_lora_to_mlp: true\n"
        "  apply_lora_to_output: true\n",
        {
            "setup.lora_targets": [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "down_proj",
                "up_proj",
                "lm_head",
            ]
        },
    ),
    (
        "torchtune",
        "seq_len",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ntokenizer:\n"
        "  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: 2048\n",
        {"seq_lens": [2048]},
    ),
    (
        "torchtune",
        "micro_batch",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: 8\n",
        {"setup.batch": 8},
    ),
    (
        "torchtune",
        "grad_accum",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "gradient_accumulation_steps: 4\n",
        {"setup.grad_accum": 4},
    ),
    (
        "torchtune",
        "optimizer",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\noptimizer:\n"
        "  _component_: bitsandbytes.optim.PagedAdamW8bit\n",
        {"setup.optimizer": "adamw-8bit", "setup.paged": True},
    ),
    (
        "torchtune",
        "optimizer",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\noptimizer:\n"
        "  _component_: torch.optim.AdamW\n  fused: false\noptimizer_in_bwd: true\n",
        {"setup.optimizer": "adamw", "setup.optimizer_impl": "in-backward"},
    ),
    (
        "torchtune",
        "bf16",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ndtype: bf16\n",
        {"setup.precision": "bf16", "setup.autocast": False},
    ),
    (
        "torchtune",
        "fp16",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ndtype: fp16\n",
        {"ignored": ["dtype"]},
    ),
    (
        "torchtune",
        "checkpointing",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "enable_activation_checkpointing: true\nac_mode: selective\n",
        {"setup.checkpointing": "selective"},
    ),
    (
        "torchtune",
        "checkpointing_offload",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "enable_activation_checkpointing: true\nenable_activation_offloading: true\n",
        {"setup.checkpointing": "offload"},
    ),
    (
        "torchtune",
        "chunked_loss",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ntokenizer:\n"
        "  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: 2048\nloss:\n"
        "  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n  num_output_chunks: 4\n",
        {"setup.loss": "chunked", "setup.loss_chunk": 512},
    ),
    (
        "torchtune",
        "packing",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ndataset:\n"
        "  _component_: torchtune.datasets.alpaca_dataset\n  packed: true\n",
        {"run.packing": True},
    ),
    (
        "torchtune",
        "fsdp",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "fsdp_cpu_offload: false\nfsdp_reshard_after_forward: false\n",
        {"setup.sharding": "zero2"},
    ),
    (
        "torchtune",
        "offload",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nfsdp_cpu_offload: true\n",
        {"setup.sharding": "fsdp", "setup.parallel": "fsdp", "setup.offload": "params"},
    ),
    (
        "torchtune",
        "fsdp",
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nfsdp_cpu_offload: true\n"
        "custom_sharded_layers: ['tok_embeddings', 'output']\n",
        {
            "setup.fsdp_wrap": "layer+embeddings+lm_head",
            "origin.fsdp_wrap": "custom_sharded_layers",
        },
    ),
    # -- TRL / HF TrainingArguments (YAML and JSON) ----------------------------------------------
    (
        "trl",
        "base_model",
        "model_name_or_path: acme/model-x\nmax_length: 512\n",
        {"model": {"hub": "acme/model-x"}},
    ),
    (
        "trl",
        "lora",
        "model_name_or_path: x/y\nuse_peft: true\nmax_length: 512\n",
        {"setup.method": "lora", "setup.lora_rank": 16, "setup.lora_alpha": 32},
    ),
    (
        "trl",
        "qlora",
        "model_name_or_path: x/y\nuse_peft: true\nload_in_4bit: true\nmax_length: 512\n",
        {"setup.method": "qlora", "setup.double_quant": False},
    ),
    (
        "trl",
        "load_in_8bit",
        '{"model_name_or_path": "x/y", "use_peft": true, "load_in_8bit": true, "max_length": 9}',
        {"setup.method": "lora", "setup.base": "int8"},
    ),
    (
        "trl",
        "load_in_4bit",
        "model_name_or_path: x/y\nload_in_4bit: true\nuse_bnb_nested_quant: true\npacking: false\n",
        {"setup.method": "qlora", "setup.double_quant": True},
    ),
    (
        "trl",
        "rank",
        "model_name_or_path: x/y\nuse_peft: true\nlora_r: 4\nmax_length: 512\n",
        {"setup.lora_rank": 4},
    ),
    (
        "trl",
        "alpha",
        "model_name_or_path: x/y\nuse_peft: true\nlora_alpha: 8\nmax_length: 512\n",
        {"setup.lora_alpha": 8},
    ),
    (
        "trl",
        "dropout",
        "model_name_or_path: x/y\nuse_peft: true\nlora_dropout: 0.0\nmax_length: 512\n",
        {"setup.lora_dropout": 0.0},
    ),
    (
        "trl",
        "targets",
        "model_name_or_path: x/y\nuse_peft: true\nlora_target_modules: all-linear\n"
        "max_length: 512\n",
        {"setup.lora_targets": ["all-linear"]},
    ),
    (
        "trl",
        "modules_to_save",
        "model_name_or_path: x/y\nuse_peft: true\nlora_modules_to_save: [embed_tokens]\n"
        "max_length: 512\n",
        {"setup.train_embeddings": True},
    ),
    ("trl", "seq_len", '{"max_seq_length": 3072, "output_dir": "o"}', {"seq_lens": [3072]}),
    ("trl", "seq_len", "max_length: 1536\n", {"seq_lens": [1536]}),
    ("trl", "micro_batch", "per_device_train_batch_size: 6\n", {"setup.batch": 6}),
    ("trl", "grad_accum", "gradient_accumulation_steps: 12\n", {"setup.grad_accum": 12}),
    (
        "trl",
        "optimizer",
        "optim: adamw_bnb_8bit\n",
        {"setup.optimizer": "adamw-8bit", "setup.paged": False},
    ),
    (
        "trl",
        "optimizer",
        "optim: adamw_torch_fused\n",
        {"setup.optimizer": "adamw", "setup.optimizer_impl": "fused"},
    ),
    (
        "trl",
        "bf16",
        "max_length: 512\n",  # SFTConfig: bf16 on unless fp16
        {"setup.autocast": True, "setup.precision": "mixed"},
    ),
    (
        "trl",
        "fp16",
        '{"output_dir": "o", "fp16": true, "bf16": false}',
        {"setup.autocast": True, "origin.precision": "fp16"},
    ),
    (
        "trl",
        "checkpointing",
        "max_length: 512\ngradient_checkpointing: false\n",
        {"setup.checkpointing": "none"},
    ),
    (
        "trl",
        "checkpointing_offload",
        "max_length: 512\nactivation_offloading: true\n",
        {"setup.checkpointing": "offload"},
    ),
    (
        "trl",
        "attention",
        "max_length: 512\nmodel_init_kwargs:\n  attn_implementation: eager\n",
        {"setup.attention": "eager"},
    ),
    ("trl", "liger", "max_length: 512\nuse_liger_kernel: true\n", {"setup.loss": "liger"}),
    ("trl", "chunked_loss", "max_length: 512\nloss_type: chunked_nll\n", {"setup.loss": "chunked"}),
    # TRL 1.16: nll (the default) and dft run the fused LM head too; label smoothing needs the
    # model's full logits
    ("trl", "chunked_loss", "max_length: 512\nloss_type: nll\n", {"setup.loss": "chunked"}),
    ("trl", "chunked_loss", "max_length: 512\nloss_type: dft\n", {"setup.loss": "chunked"}),
    (
        "trl",
        "chunked_loss",
        "max_length: 512\nloss_type: nll\nlabel_smoothing_factor: 0.1\n",
        {"setup.loss": "full"},
    ),
    (
        "trl",
        "packing",
        "max_length: 512\npacking: true\npacking_strategy: wrapped\n",
        {"run.packing": True, "run.packing_strategy": "wrapped"},
    ),
    (
        "trl",
        "fsdp",
        '{"output_dir": "o", "fsdp": ["full_shard", "auto_wrap"], '
        '"fsdp_config": {"reshard_after_forward": false}}',
        {"setup.sharding": "zero2"},
    ),
    (
        "trl",
        "deepspeed",
        '{"output_dir": "o", "deepspeed": {"zero_optimization": {"stage": 1}, '
        '"train_micro_batch_size_per_gpu": "auto"}}',
        {"setup.stack": "deepspeed", "setup.sharding": "zero1"},
    ),
    (
        "trl",
        "offload",
        '{"output_dir": "o", "fsdp": "full_shard offload"}',
        {"setup.sharding": "fsdp", "setup.offload": "params"},
    ),
    # -- DeepSpeed JSON and accelerate config (companions of the above) --------------------------
    (
        "deepspeed",
        "deepspeed",
        '{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 2, '
        '"gradient_accumulation_steps": 8, "bf16": {"enabled": true}}',
        {
            "setup.sharding": "zero3",
            "setup.batch": 2,
            "setup.grad_accum": 8,
            "setup.precision": "mixed",
        },
    ),
    (
        "deepspeed",
        "offload",
        '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}, '
        '"activation_checkpointing": {"cpu_checkpointing": true}}',
        {
            "setup.checkpointing": "offload",
            "setup.offload": "params",
            "ignored": ["zero_optimization.offload_param.device"],  # NVMe counted as host
        },
    ),
    (
        "deepspeed",
        "offload",
        '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, '
        '"offload_optimizer": {"device": "cpu"}}}',
        {
            "setup.parallel": "zero2",
            "setup.offload": "optimizer",
            "ignored": ["zero_optimization.offload_param.device"],  # stage 3 only
        },
    ),
    (
        "accelerate",
        "fsdp",
        "distributed_type: FSDP\nnum_processes: 8\nmixed_precision: fp16\nfsdp_config:\n"
        "  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_offload_params: true\n",
        {
            "setup.num_gpus": 8,
            "setup.sharding": "zero2",
            "setup.parallel": "fsdp",
            "setup.reshard_after_forward": False,
            "setup.autocast": True,
            "setup.offload": "params",
        },
    ),
    (
        "accelerate",
        "fsdp",  # no sharding: DDP keeps a whole copy per card (not device_map's split)
        "distributed_type: MULTI_GPU\nnum_processes: 2\n",
        {"setup.num_gpus": 2, "setup.parallel": "dp"},
    ),
    (
        "accelerate",
        "fsdp",  # TRL's trl/accelerate_configs/single_gpu.yaml: `accelerate launch` runs one
        "distributed_type: 'NO'\nnum_processes: 8\ndowncast_bf16: 'no'\n",  # process for NO
        {"setup.num_gpus": 1, "ignored": ["num_processes"], "warnings": []},
    ),
    (
        "trl",
        "base_model",  # TRL's examples/cli_configs/example_config.yaml: script keys first
        "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: stanfordnlp/imdb\n"
        "learning_rate: 0.0001\nlr_scheduler_type: cosine\n",
        {"model.hub": "Qwen/Qwen2.5-0.5B", "setup.stack": "hf"},
    ),
    (
        "accelerate",
        "deepspeed",
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
        "  offload_optimizer_device: cpu\n  gradient_accumulation_steps: 4\n",
        {
            "setup.stack": "deepspeed",
            "setup.sharding": "zero3",
            "setup.parallel": "zero3",
            "setup.grad_accum": 4,
            "setup.offload": "optimizer",
        },
    ),
]

DEEPSPEED_BESIDE = {
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
    "train_micro_batch_size_per_gpu": 2,
}


def _lookup(mapping: Any, path: str) -> Any:
    doc = mapping.as_dict()
    if "." not in path:
        return doc[path]
    section, name = path.split(".", 1)
    return doc[section].get(name, "<absent>")


@pytest.mark.parametrize(
    ("fmt", "field", "text", "expected"),
    CASES,
    ids=[f"{c[0]}-{c[1]}-{n}" for n, c in enumerate(CASES)],
)
def test_field_is_mapped(
    fmt: str, field: str, text: str, expected: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(DEEPSPEED_BESIDE))
    name = "config.json" if text.lstrip().startswith("{") else "config.yml"
    path = tmp_path / name
    path.write_text(text)
    mapping = read_file(path)
    detected = mapping.format.replace("hf-trainer", "trl")
    assert detected == fmt, f"detected as {mapping.format}"
    for key, value in expected.items():
        if key == "ignored":
            assert set(value) <= {i.key for i in mapping.ignored}, mapping.ignored
        elif key.startswith("origin."):
            assert mapping.origin[key[7:]] == value
        else:
            assert _lookup(mapping, key) == value, key


def test_every_format_covers_every_field_or_says_why_not() -> None:
    covered: dict[str, set[str]] = defaultdict(set)
    for fmt, field, _, _ in CASES:
        assert field in FIELDS, field
        covered[fmt].add(field)
    for fmt in ("axolotl", "llamafactory", "torchtune", "trl"):
        missing = set(FIELDS) - covered[fmt] - set(NOT_IN_FORMAT.get(fmt, {}))
        assert not missing, f"{fmt}: no case for {sorted(missing)}"
    assert {"fsdp", "deepspeed", "offload"} <= covered["deepspeed"] | covered["accelerate"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("base_model: x/y\nactivation_memory_budget: 0.5\n", "activation_memory_budget"),
        ("model_name_or_path: x/y\nstage: sft\nmodel_max_length: 8192\n", "model_max_length"),
        (
            "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
            "  quantize_base_layers: true\n",
            "model.quantize_base_layers",
        ),
        ("max_length: 512\nfp8_recipe: tensorwise\n", "fp8_recipe"),
        ('{"zero_optimization": {"stage": 2}, "compile": {"disable": false}}', None),
        ("distributed_type: FSDP\nfsdp_config:\n  fsdp_cpu_offload_pin_memory: true\n", None),
    ],
)
def test_unread_keys_that_may_matter_are_warnings_naming_the_key(
    text: str, key: str | None
) -> None:
    mapping = map_config(parse_text(text, "c.json" if text.startswith("{") else "c.yml"))
    if key is None:  # a DeepSpeed / accelerate key: named with its path
        assert mapping.warnings, mapping.as_dict()
        assert all(":" in w for w in mapping.warnings)
    else:
        assert any(w.startswith(f"{key}:") for w in mapping.warnings), mapping.warnings


def test_zero_buffer_sizes_off_the_default_are_listed_and_unknown_zero_keys_warn() -> None:
    text = json.dumps(
        {
            "zero_optimization": {
                "stage": 3,
                "overlap_comm": True,
                "reduce_bucket_size": "auto",
                "stage3_max_live_parameters": 1e9,
                "stage3_prefetch_bucket_size": 1e8,
                "zero_hpz_partition_size": 8,
            }
        }
    )
    mapping = map_config(parse_text(text, "ds.json"))
    assert {i.key for i in mapping.ignored} == {"zero_optimization.stage3_prefetch_bucket_size"}
    assert [w.split(":")[0] for w in mapping.warnings] == [
        "zero_optimization.zero_hpz_partition_size"
    ]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "train_configs"
ODD_VALUES = ("abc", "4k", -1, 0, [], {}, None, True, [1, "x"], {"a": 1})


def _key_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _key_paths(value, (*prefix, key))
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.iterdir()))
def test_odd_values_at_every_key_are_mapped_or_named_bad_input(name: str) -> None:
    """Each key of each example set to a string, a negative, a list, a mapping...: the reader
    maps it (the request's validation names it later) or raises EstimatorInputError naming
    `train_config.<key>`; never another exception."""
    from estimator.errors import EstimatorInputError

    base = parse_text((EXAMPLES / name).read_text(), name)
    for path in _key_paths(base):
        for odd in ODD_VALUES:
            data = json.loads(json.dumps(base))
            target = data
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = odd
            if path != ("deepspeed",):
                data.pop("deepspeed", None)  # a file beside the example: not read here
            try:
                map_config(data, None, None, name)
            except EstimatorInputError as err:
                assert err.field.startswith("train_config"), (path, odd, err.field)


def test_deepspeeds_optimizer_acceptance_flags_are_read_without_a_warning() -> None:
    text = (
        '{"zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": true, '
        '"zero_force_ds_cpu_optimizer": true}'
    )
    mapping = map_config(parse_text(text, "c.json"))
    assert mapping.warnings == [] and mapping.setup["sharding"] == "zero3"


@pytest.mark.parametrize(
    "value, kind",
    [
        ("kernels-community/flash-attn3", "flash"),
        ("paged|kernels-community/vllm-flash-attn3@main:flash_attn", "flash"),
        ("kernels-community/flash-mla", None),
        ("sdpa", "sdpa"),
    ],
)
def test_hub_kernel_names_are_read_as_transformers_registers_them(
    value: str, kind: str | None
) -> None:
    from estimator.train_config.vocab import _attention_kind

    assert _attention_kind(value) == kind
