"""Training configs in: one example per format (written for these tests, examples/train_configs),
mapped and checked field by field; detection, companion files, bad input, CLI overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.errors import EstimatorInputError
from estimator.train_config import (
    detect_format,
    map_config,
    parse_text,
    read_file,
    read_train_config_text,
    read_train_configs,
    split_supported,
)
from trainfit.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "train_configs"


def ignored_keys(mapping: object) -> set[str]:
    return {i.key for i in mapping.ignored}  # type: ignore[attr-defined]


def test_axolotl_qlora_with_deepspeed_beside_it() -> None:
    m = read_file(EXAMPLES / "axolotl-qlora-llama31-8b.yml")
    assert m.format == "axolotl"
    assert m.sources[1].endswith("deepspeed-zero2.json")
    assert m.model == {"preset": "llama-3.1-8b"}  # meta-llama/Llama-3.1-8B is that preset's source
    assert m.setup == {
        "stack": "deepspeed",  # the DeepSpeed JSON beside it wins over axolotl's `hf`
        "method": "qlora",
        "lora_rank": 32,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "lora_targets": ["all-linear"],
        "train_embeddings": True,
        "double_quant": True,
        "batch": 2,
        "grad_accum": 4,
        "optimizer": "adamw-8bit",
        "paged": True,
        "autocast": True,
        "precision": "mixed",
        "checkpointing": "gpu",
        "attention": "flash",
        "loss": "cce",
        "compile": True,  # torch_compile
        "liger_kernels": True,  # liger_rms_norm + liger_glu_activation
        "sharding": "zero2",
        "parallel": "zero2",  # estimator/parallel's exact ZeRO-2
        "offload": "optimizer",  # zero_optimization.offload_optimizer.device: cpu
    }
    assert m.seq_lens == [8192]
    assert m.run == {"epochs": 2, "packing": True, "packing_strategy": "multipack"}
    assert ignored_keys(m) == {"lora_qkv_kernel"}
    assert m.warnings == []
    assert m.origin["double_quant"].startswith("(axolotl QLoRA default")
    assert m.origin["sharding"] == "deepspeed:zero_optimization.stage"


def test_llamafactory_8bit_lora() -> None:
    m = read_file(EXAMPLES / "llamafactory-lora-qwen3-8b.yml")
    assert m.format == "llamafactory"
    assert m.model == {"preset": "qwen3-8b"}
    assert m.setup == {
        "stack": "hf",
        "batch": 1,
        "grad_accum": 8,
        "optimizer": "adamw",
        "optimizer_impl": "foreach",
        "autocast": True,
        "precision": "mixed",
        "method": "lora",
        "base": "int8",
        "lora_rank": 16,
        "lora_alpha": 32,  # LLaMA-Factory's default: 2 x lora_rank
        "lora_dropout": 0.0,
        "lora_targets": ["all-linear"],
        "train_embeddings": True,
        "attention": "flash",
        "checkpointing": "gpu",  # on unless disable_gradient_checkpointing
        "loss": "liger",
        "liger_kernels": True,  # enable_liger_kernel: the model's Liger defaults
        "padded_batches": True,  # no packing: the SFT collator pads to a multiple of 8
    }
    assert m.seq_lens == [4096]
    assert m.run == {"epochs": 3.0}
    assert ignored_keys(m) == {"upcast_layernorm"}
    assert m.warnings == []


def test_torchtune_qlora_recipe() -> None:
    m = read_file(EXAMPLES / "torchtune-qlora-llama31-8b.yml")
    assert m.format == "torchtune"
    assert m.model == {"preset": "llama-3.1-8b"}
    assert m.setup == {
        "stack": "torchtune",
        "method": "qlora",
        "lora_targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"],
        "lora_rank": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "double_quant": True,
        "batch": 2,
        "grad_accum": 16,
        "optimizer": "adamw",
        "optimizer_impl": "fused",
        "loss": "chunked",
        "loss_chunk": 512,  # 4096 positions / 8 output chunks
        "checkpointing": "offload",
        "precision": "bf16",
        "autocast": False,
        "compile": False,
    }
    assert m.seq_lens == [4096]
    assert m.run == {"epochs": 1, "packing": True, "packing_strategy": "greedy"}
    assert m.ignored == [] and m.warnings == []


def test_trl_sftconfig_json_dump() -> None:
    m = read_file(EXAMPLES / "trl-sftconfig.json")
    assert m.format == "trl"
    assert m.model is None  # TrainingArguments do not name the model
    assert m.setup == {
        "stack": "hf",
        "batch": 4,
        "grad_accum": 2,
        "optimizer": "adamw",
        "optimizer_impl": "fused",
        "autocast": True,
        "precision": "mixed",
        "checkpointing": "gpu",
        "compile": False,
        "sharding": "fsdp",
        "parallel": "fsdp",
        "loss": "chunked",  # loss_type null -> chunked_nll in this TRL release
        "attention": "sdpa",
    }
    assert m.seq_lens == [2048]
    assert m.run == {"epochs": 3.0, "packing": True, "packing_strategy": "bfd"}
    assert m.ignored == [] and m.warnings == []


def test_trl_yaml_with_model_config_keys_and_accelerate_fsdp_beside_it() -> None:
    m = read_train_configs([EXAMPLES / "trl-sft-qlora.yml", EXAMPLES / "accelerate-fsdp.yml"])
    assert m.format == "trl"
    assert [Path(s).name for s in m.sources] == ["trl-sft-qlora.yml", "accelerate-fsdp.yml"]
    assert m.model == {"preset": "qwen3-8b"}
    assert m.setup == {
        "attention": "flash",
        "method": "qlora",
        "lora_rank": 64,
        "lora_alpha": 128,
        "lora_dropout": 0.05,  # TRL ModelConfig default
        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "double_quant": True,
        "stack": "hf",
        "batch": 1,
        "grad_accum": 16,
        "optimizer": "adamw",
        "paged": True,
        "autocast": True,
        "precision": "mixed",
        "checkpointing": "offload",  # TRL's activation_offloading + accelerate's FSDP AC
        "liger_kernels": True,  # use_liger_kernel: Liger's defaults
        "loss": "liger",
        "num_gpus": 4,
        "sharding": "fsdp",
        "parallel": "fsdp",
        "offload": "params",  # fsdp_offload_params: parameters, gradients and states
    }
    assert m.seq_lens == [16384]
    assert ignored_keys(m) == set()


def test_accelerate_and_deepspeed_alone() -> None:
    acc = read_file(EXAMPLES / "accelerate-fsdp.yml")
    assert acc.format == "accelerate"
    assert acc.setup == {
        "num_gpus": 4,
        "autocast": True,
        "precision": "mixed",
        "sharding": "fsdp",
        "parallel": "fsdp",
        "offload": "params",
        "checkpointing": "gpu",
    }
    ds = read_file(EXAMPLES / "deepspeed-zero2.json")
    assert ds.format == "deepspeed"
    assert ds.setup == {  # "auto" values are skipped
        "stack": "deepspeed",
        "sharding": "zero2",
        "parallel": "zero2",
        "offload": "optimizer",
    }
    assert ignored_keys(ds) == set()


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ("model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n", "torchtune"),
        ("distributed_type: FSDP\n", "accelerate"),
        ('{"zero_optimization": {"stage": 3}}', "deepspeed"),
        ("base_model: x/y\n", "axolotl"),
        ("model_name_or_path: x/y\ncutoff_len: 1024\n", "llamafactory"),
        ("per_device_train_batch_size: 2\n", "trl"),
        ("hello: world\n", None),
    ],
)
def test_detection(text: str, fmt: str | None) -> None:
    assert detect_format(parse_text(text)) == fmt


def test_fsdp_strategies_and_zero_stages() -> None:
    m = map_config({"fsdp": "shard_grad_op auto_wrap offload"}, "hf")
    assert m.setup["sharding"] == "zero2"  # the legacy field; the layout is exact:
    assert (m.setup["parallel"], m.setup["reshard_after_forward"]) == ("fsdp", False)
    assert m.setup["offload"] == "params"
    m = map_config({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 4})
    assert (m.setup["sharding"], m.setup["batch"]) == ("zero3", 4)
    m = map_config(
        {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False}}
    )
    assert m.setup["sharding"] == "zero2"


def test_unknown_optimizer_and_unread_memory_keys_are_reported() -> None:
    m = map_config({"base_model": "x/y", "optimizer": "muon", "activation_memory_budget": 0.5})
    assert "optimizer" in ignored_keys(m)
    assert any(w.startswith("activation_memory_budget:") for w in m.warnings)
    assert "optimizer" not in m.setup


def test_split_supported_by_the_current_training_setup() -> None:
    from estimator.setup import TrainingSetup

    accepted, rejected = split_supported(
        {"method": "qlora", "loss": "surely-not-a-loss", "no_such_field": 1},
        TrainingSetup.model_fields,
    )
    assert accepted == {"method": "qlora"}
    assert {r.key for r in rejected} == {"loss", "no_such_field"}


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(EstimatorInputError) as err:
        read_file(tmp_path / "missing.yml")
    assert err.value.field == "train_config"
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    with pytest.raises(EstimatorInputError, match="expected a mapping"):
        read_file(tmp_path / "list.yml")
    (tmp_path / "bad.yml").write_text("a: [1, 2\n")
    with pytest.raises(EstimatorInputError, match="not valid YAML"):
        read_file(tmp_path / "bad.yml")
    with pytest.raises(EstimatorInputError, match="not recognised"):
        read_train_config_text("hello: world\n")
    with pytest.raises(EstimatorInputError, match="not valid JSON"):
        read_train_config_text("{", "json")


def test_missing_deepspeed_file_is_listed_as_ignored(tmp_path: Path) -> None:
    path = tmp_path / "a.yml"
    path.write_text("base_model: x/y\ndeepspeed: nowhere.json\n")
    assert "deepspeed" in ignored_keys(read_file(path))


def test_cli_options_beside_the_file_win(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(EXAMPLES / "axolotl-qlora-llama31-8b.yml")
    argv = ["check", "--train-config", config, "--gpu", "h100-80gb", "--format", "json"]
    assert main([*argv, "--lora-rank", "8", "--seq=4096"]) in (0, 1)
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["seq_len"] == 4096  # --seq=4096 beats sequence_len 8192
    assert doc["train_config"]["setup"]["lora_rank"] == 32  # what the file said
    assert "lora_qkv_kernel" in {i["key"] for i in doc["setup"]["ignored"]}
    assert doc["train_config"]["setup"]["offload"] == "optimizer"  # the DeepSpeed JSON beside it
    assert doc["train_config"]["setup"]["liger_kernels"] is True
    assert "ignored lora_qkv_kernel: axolotl's fused/tiled kernel" in captured.err
    # the same without overrides uses the file's length
    assert main(argv) in (0, 1)
    assert json.loads(capsys.readouterr().out)["seq_len"] == 8192


def test_cli_exit_code_follows_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(EXAMPLES / "torchtune-qlora-llama31-8b.yml")
    assert main(["check", "--train-config", config, "--gpu", "h100-80gb"]) == 0
    assert main(["check", "--train-config", config, "--gpu", "8gib", "--seq", "65536"]) == 1
    capsys.readouterr()
    assert main(["check", "--train-config", "/nonexistent.yml", "--gpu", "h100-80gb"]) == 2
    assert "train_config: no such file" in capsys.readouterr().err


def test_rest_body_fields_win_over_the_config_text() -> None:
    from estimator.request import CheckRequest
    from estimator.train_config.body import apply_to_body

    text = (EXAMPLES / "torchtune-qlora-llama31-8b.yml").read_text()
    body = {"setup": {"batch": 1}, "gpu": "h100-80gb"}
    merged = apply_to_body(body, read_train_config_text(text, "torchtune"))
    report = merged.pop("train_config")
    req = CheckRequest.model_validate(merged)
    assert req.model.preset == "llama-3.1-8b"
    assert req.seq_lens == [4096]
    assert (req.setup.batch, req.setup.method, req.setup.lora_rank) == (1, "qlora", 16)
    assert "grad_accum" in {i["key"] for i in report["ignored"]} or hasattr(req.setup, "grad_accum")


@pytest.mark.parametrize("command", ["estimate", "check", "max-seq", "max-batch", "recommend"])
def test_every_planning_command_reads_the_config_and_lists_what_it_ignored(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(EXAMPLES / "axolotl-qlora-llama31-8b.yml")
    argv = [command, "--train-config", config, "--gpu", "h100-80gb", "--format", "json"]
    assert main([*argv, "--lora-rank", "8"]) in (0, 1)
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    ignored = {i["key"] for i in doc["setup"]["ignored"]}
    assert "lora_qkv_kernel" in ignored
    assert doc["train_config"]["setup"]["liger_kernels"] is True  # liger_rms_norm + glu
    assert doc["train_config"]["model"] == {"preset": "llama-3.1-8b"}
    assert "ignored lora_qkv_kernel: axolotl's fused/tiled kernel" in captured.err
    if command == "estimate":
        assert doc["model"]["name"] == "llama-3.1-8b"
        assert [r["seq_len"] for r in doc["rows"]] == [8192]  # the file's sequence_len
        assert doc["setup"]["method"] == "qlora" and doc["setup"]["lora_rank"] == 8  # CLI wins
    if command == "recommend":
        assert doc["method"] == "qlora" and doc["required_seq_len"] == 8192


def test_a_full_training_arguments_dump_maps_without_false_warnings(tmp_path: Path) -> None:
    """`TrainingArguments.to_dict()` of the installed transformers (114 keys), with what a user
    sets, then the same with TRL's SFTConfig keys added: only the set keys count, no warnings."""
    transformers = pytest.importorskip("transformers")
    dump = transformers.TrainingArguments(output_dir=str(tmp_path / "out")).to_dict()
    dump.update(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        optim="adamw_bnb_8bit",
        bf16=True,
        gradient_checkpointing=True,
        fsdp="full_shard auto_wrap",
    )
    (tmp_path / "args.json").write_text(json.dumps(dump, default=str))
    m = read_file(tmp_path / "args.json")
    assert m.format == "hf-trainer"
    assert m.setup == {
        "stack": "hf",
        "batch": 2,
        "grad_accum": 4,
        "optimizer": "adamw-8bit",
        "paged": False,
        "autocast": True,
        "precision": "mixed",
        "checkpointing": "gpu",
        "compile": False,
        "sharding": "fsdp",
        "parallel": "fsdp",
        "loss": "full",  # the Trainer runs the model's own loss, not TRL's chunked_nll
    }
    assert m.warnings == [] and m.ignored == []
    sft = {
        **dump,
        "max_length": 4096,
        "packing": True,
        "packing_strategy": "bfd",
        "padding_free": False,
        "loss_type": None,
        "activation_offloading": False,
        "dataset_text_field": "text",
        "completion_only_loss": None,
        "assistant_only_loss": False,
        "model_init_kwargs": None,
    }
    (tmp_path / "sft.json").write_text(json.dumps(sft, default=str))
    m = read_file(tmp_path / "sft.json")
    assert m.format == "trl" and m.seq_lens == [4096] and m.setup["loss"] == "chunked"
    assert m.run["packing"] is True
    assert m.warnings == [] and m.ignored == []


def test_sharding_on_the_command_line_replaces_the_configs_layout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = str(EXAMPLES / "axolotl-qlora-llama31-8b.yml")  # ZeRO-2 + optimizer offload
    argv = ["estimate", "--train-config", config, "--gpu", "h100-80gb", "--format", "json"]
    assert main([*argv, "--sharding", "none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["setup"]["sharding"], doc["setup"]["parallel"]) == ("none", None)
    assert {"parallel", "offload"} <= {i["key"] for i in doc["setup"]["ignored"]}
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["setup"]["parallel"], doc["setup"]["offload"]) == ("zero2", "optimizer")


def test_a_bad_length_in_the_config_is_exit_2_and_a_422_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a.yml"
    path.write_text("base_model: x/y\nsequence_len: 4k\n")
    assert main(["check", "--train-config", str(path), "--gpu", "h100-80gb"]) == 2
    assert "train_config.sequence_len: expected a whole number, got '4k'" in capsys.readouterr().err
    with pytest.raises(EstimatorInputError) as err:
        read_train_config_text("model_name_or_path: x/y\ncutoff_len: 0\n")
    assert err.value.field == "train_config.cutoff_len"


@pytest.mark.parametrize(
    ("component", "paged"),
    [
        ("torchao.prototype.low_bit_optim.AdamW8bit", False),
        ("torchao.optim.AdamW8bit", False),
        ("bitsandbytes.optim.PagedAdamW8bit", True),
    ],
)
def test_torchtune_8bit_optimizers_of_its_tutorial(component: str, paged: bool) -> None:
    """torchtune's memory tutorial names torchao's AdamW8bit and bitsandbytes' PagedAdamW8bit;
    both keep 8-bit states, only the bitsandbytes one pages them out of torch's allocator."""
    text = (
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_3b\n"
        f"optimizer:\n  _component_: {component}\n  lr: 2e-5\noptimizer_in_bwd: True\n"
    )
    m = read_train_config_text(text, "torchtune")
    assert (m.setup["optimizer"], m.setup["paged"]) == ("adamw-8bit", paged)
    assert m.setup["optimizer_impl"] == "in-backward"
    assert "optimizer._component_" not in ignored_keys(m)


@pytest.mark.parametrize(
    ("component", "warned"),
    [
        ("torchtune.modules.loss.CEWithChunkedOutputLoss", False),
        ("torchtune.modules.loss.LinearCrossEntropyLoss", True),
    ],
)
def test_torchtune_losses_map_to_the_released_chunked_loss(component: str, warned: bool) -> None:
    """0.6.1 (the last torchtune release) has CEWithChunkedOutputLoss; main's
    LinearCrossEntropyLoss is in no release and keeps fewer bytes (no chunk's bf16 logits
    held): it is estimated as 0.6.1's loss, and a warning names the key and says so."""
    text = (
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\ntokenizer:\n"
        "  _component_: torchtune.models.llama3.llama3_tokenizer\n  max_seq_len: 2048\n"
        f"loss:\n  _component_: {component}\n"
    )
    m = read_train_config_text(text, "torchtune")
    assert (m.setup["loss"], m.setup["loss_chunk"]) == ("chunked", 256)
    warnings = [w for w in m.warnings if w.startswith("loss._component_")]
    assert bool(warnings) == warned
    if warned:
        assert "no release" in warnings[0] and "CEWithChunkedOutputLoss" in warnings[0]


@pytest.mark.parametrize(
    "text",
    [
        "base_model: x/y\nloss_watchdog_threshold: 5.0\nloss_watchdog_patience: 3\n",
        "model_name_or_path: x/y\nstage: sft\nplot_loss: true\n",
    ],
)
def test_keys_that_only_watch_the_loss_are_not_warned_about(text: str) -> None:
    """axolotl's loss watchdog and LLaMA-Factory's loss plot match the memory words (`loss`)
    but change no memory: read, without a warning."""
    mapping = read_train_config_text(text)
    assert not [w for w in mapping.warnings if "loss" in w.split(":")[0]]


def test_a_torchtune_config_that_trains_nothing_is_said_to_be_one() -> None:
    """torchtune's evaluation / generation configs (no optimizer, no loss) are priced as a
    training step only with a warning saying so; a training recipe gets no such warning."""
    model = "model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n"
    evaluation = read_train_config_text(model + "batch_size: 8\ntasks: [truthfulqa_mc2]\n")
    assert any(w.startswith("optimizer, loss:") for w in evaluation.warnings)
    recipe = read_train_config_text(model + "optimizer:\n  _component_: torch.optim.AdamW\n")
    assert not any(w.startswith("optimizer, loss:") for w in recipe.warnings)


@pytest.mark.parametrize(
    ("quant", "ignored"),
    [
        ("Mxfp4Config\nmodel_quantization_config_kwargs:\n  dequantize: true\n", False),
        ("Mxfp4Config\n", True),
        ("FineGrainedFP8Config\n", True),
    ],
)
def test_axolotl_s_load_time_quantization(quant: str, ignored: bool) -> None:
    """gpt-oss dequantized on load (axolotl's examples) is the bf16 trainfit counts; a model
    kept in MXFP4 or FP8 is reported, not priced silently as bf16."""
    mapping = read_train_config_text("base_model: x/y\nmodel_quantization_config: " + quant)
    assert ("model_quantization_config" in {i.key for i in mapping.ignored}) is ignored
    assert not [w for w in mapping.warnings if w.startswith("model_quantization")]


@pytest.mark.parametrize(
    ("extra", "ignored"),
    [
        ("tensor_model_parallel_size: 4\n", "tensor_model_parallel_size"),
        (
            "tensor_model_parallel_size: 1\nuse_distributed_optimizer: true\n",
            "use_distributed_optimizer",
        ),
        ("tensor_model_parallel_size: 1\npipeline_model_parallel_size: 1\n", None),
        ("use_v1_kernels: true\n", None),
    ],
)
def test_llamafactory_s_megatron_and_v1_kernel_keys(extra: str, ignored: str | None) -> None:
    """LLaMA-Factory's Megatron-Core options are reported when they split anything; its
    use_v1_kernels (NPU kernels only) changes nothing on CUDA: no warnings either way."""
    base = "model_name_or_path: x/y\nstage: sft\nper_device_train_batch_size: 1\n"
    mapping = read_train_config_text(base + extra)
    keys = {i.key for i in mapping.ignored}
    assert (ignored in keys) if ignored else not (keys & {"tensor_model_parallel_size"})
    assert not [w for w in mapping.warnings if "size" in w or "kernels" in w]


def test_transformers_torchao_8bit_adamw_is_the_8bit_optimizer() -> None:
    """`optim: adamw_torch_8bit` (24 of axolotl's example configs) is torchao's AdamW8bit:
    8-bit states as bitsandbytes' blockwise ones, not an unmodelled optimizer."""
    mapping = read_train_config_text("base_model: x/y\noptimizer: adamw_torch_8bit\n")
    assert (mapping.setup["optimizer"], mapping.setup["paged"]) == ("adamw-8bit", False)
    assert "optimizer" not in {i.key for i in mapping.ignored}


def test_fsdp1_s_rate_limiter() -> None:
    """`fsdp_limit_all_gathers: true` (FSDP1's default, 18 of axolotl's examples) is what the
    gathered-layer terms assume: read; false is reported."""
    text = "base_model: x/y\nfsdp_config:\n  fsdp_limit_all_gathers: {}\n"
    on = read_train_config_text(text.format("true"))
    assert not on.warnings and not on.ignored
    off = read_train_config_text(text.format("false"))
    assert "fsdp_config.fsdp_limit_all_gathers" in {i.key for i in off.ignored}


@pytest.mark.parametrize(
    ("value", "version", "reported"),
    [
        ("BACKWARD_PRE", None, False),  # current + next unit: the two gathered units counted
        ("BACKWARD_POST", None, True),
        ("NO_PREFETCH", None, True),
        ("BACKWARD_POST", "2", False),  # accelerate drops it under FSDP2
    ],
)
def test_fsdp1_s_backward_prefetch(value: str, version: str | None, reported: bool) -> None:
    """Before, `fsdp_backward_prefetch` (5 of LLaMA-Factory's and axolotl's examples) was an
    unread-key warning. torch's own enum has the two prefetching values read here."""
    from torch.distributed.fsdp import BackwardPrefetch

    assert {"BACKWARD_PRE", "BACKWARD_POST"} == set(BackwardPrefetch.__members__)
    text = f"base_model: x/y\nfsdp_config:\n  fsdp_backward_prefetch: {value}\n"
    if version:
        text += f"fsdp_version: {version}\n"
    mapping = read_train_config_text(text)
    assert not any("backward_prefetch" in w for w in mapping.warnings)
    keys = {i.key for i in mapping.ignored}
    assert ("fsdp_config.fsdp_backward_prefetch" in keys) is reported


@pytest.mark.parametrize(
    ("extra", "key", "count"),
    [
        ("ref_checkpointer:\n  checkpoint_dir: /tmp/ref\n", "ref_checkpointer", 1),  # DPO, GRPO
        (
            "ref_policy_checkpointer:\n  checkpoint_dir: /a\nvalue_checkpointer:\n"
            "  checkpoint_dir: /b\nreward_checkpointer:\n  checkpoint_dir: /c\n"
            "ppo_batch_size: 32\nforward_batch_size: 16\nmin_response_length: 18\n",
            "ref_policy_checkpointer",
            3,
        ),
    ],
)
def test_torchtune_s_other_models_are_reported(extra: str, key: str, count: int) -> None:
    """A DPO / GRPO recipe's reference model and PPO's reference, value and reward models add
    whole models (full_dpo_distributed.py:279, ppo_full_finetune_single_device.py:165-172):
    listed under ignored, not left as unread-key warnings."""
    base = (
        "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n"
        "optimizer:\n  _component_: torch.optim.AdamW\n"
    )
    mapping = read_train_config_text(base + extra)
    reasons = {i.key: i.reason for i in mapping.ignored}
    assert f"loads {count} more model(s)" in reasons[key]
    assert not [w for w in mapping.warnings if "not read" in w]
    assert read_train_config_text(base).ignored == []


def test_torchtune_s_qat_and_distillation_are_reported() -> None:
    """A QAT quantizer and a distillation teacher change memory in ways not modelled (the
    teacher adds a whole model): listed under ignored, not left as unread-key warnings."""
    model = "model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n"
    qat = (
        "quantizer:\n"
        "  _component_: torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer\n"
    )
    kd = (
        "teacher_model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n"
        "teacher_checkpointer:\n  checkpoint_dir: /tmp/teacher\nkd_loss:\n"
        "  _component_: torchtune.modules.loss.ForwardKLWithChunkedOutputLoss\nkd_ratio: 0.5\n"
    )
    for extra, key in ((qat, "quantizer"), (kd, "teacher_model")):
        mapping = read_train_config_text(
            model + "optimizer:\n  _component_: torch.optim.AdamW\n" + extra
        )
        assert key in {i.key for i in mapping.ignored}
        assert not [w for w in mapping.warnings if "not read" in w]


def test_axolotl_s_keys_without_device_memory_read_silently() -> None:
    """Before, each was an unread-key warning in the examples (axolotl 067b021c
    utils/schemas/config.py:222, 777, 802); the removed flash_attn_rms_norm is reported."""
    text = (
        "base_model: x/y\nauto_resume_from_checkpoints: true\n"
        "streaming_multipack_buffer_size: 10000\nflex_attn_compile_kwargs:\n  dynamic: false\n"
    )
    mapping = read_train_config_text(text)
    assert not [w for w in mapping.warnings if "not read" in w]
    removed = read_train_config_text("base_model: x/y\nflash_attn_rms_norm: true\n")
    assert "flash_attn_rms_norm" in {i.key for i in removed.ignored}
    fp8 = read_train_config_text(
        "base_model: x/y\nfp8: true\nfp8_enable_fsdp_float8_all_gather: true\n"
    )
    assert "fp8" in {i.key for i in fp8.ignored}
    assert not [w for w in fp8.warnings if "not read" in w]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("use_asft_loss: true\n", "use_asft_loss"),  # a reference model and its logits
        ("use_dft_loss: true\n", "use_dft_loss"),
        ("use_eaft_loss: true\n", "use_eaft_loss"),
        ("fp8: true\nfp8_backend: torchao\nfp8_enable_fsdp_float8_all_gather: true\n", "fp8"),
    ],
)
def test_llamafactory_s_own_losses_and_fp8_are_reported(extra: str, key: str) -> None:
    """LLaMA-Factory's ASFT / DFT / EAFT losses and FP8 (hparams/finetuning_args.py:526-538,
    training_args.py:123-130) were unread-key warnings: now listed under ignored."""
    base = "model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\nloraplus_lr_ratio: 16\n"
    mapping = read_train_config_text(base + extra)
    assert key in {i.key for i in mapping.ignored}
    assert not [w for w in mapping.warnings if "not read" in w]
