"""`--stack hf`: steps run by transformers' Trainer + peft (+ bitsandbytes), on the CPU and fake."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from memtest_schema import load_memtest  # noqa: E402
from probe import run_probe  # noqa: E402
from probe.cli import EXIT_BAD_INPUT, EXIT_OK, main  # noqa: E402
from tests.probe.conftest import load  # noqa: E402

HF_LORA = {
    "stack": "hf",
    "method": "lora",
    "lora_rank": 4,
    "lora_dropout": 0.05,
    "grad_accum": 2,
    "checkpointing": "none",
}


def test_cli_runs_one_hf_step_with_dropout_autocast_and_grad_accumulation(tmp_path, configs_dir):
    out = tmp_path / "m.json"
    rc = main(
        [
            "--config", str(configs_dir / "tiny-llama.json"),
            "--stack", "hf", "--method", "lora", "--lora-rank", "4",
            "--lora-dropout", "0.05", "--autocast", "--grad-accum", "2",
            "--device", "cpu", "--sweep", "64", "--steps", "1",
            "--out", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert rc == EXIT_OK
    doc = load_memtest(out.read_text())
    env, setup, res = doc["environment"], doc["setup"], doc["results"][0]
    assert res["status"] == "ok" and res["steps"] == 1
    assert setup["stack"] == "hf" and setup["autocast"] is True
    assert setup["lora_dropout"] == 0.05 and setup["grad_accum"] == 2
    assert env["stack"] == "hf"
    assert env["libraries"]["transformers"] == env["transformers"]
    assert env["libraries"]["peft"] and env["libraries"]["accelerate"]
    ran = " ".join(env["ran"])
    assert "Trainer.train()" in ran and "gradient_accumulation_steps=2" in ran
    assert "bf16=True" in ran and "lora_dropout=0.05" in ran
    substituted = " ".join(env["substituted"])
    assert "random weights" in substituted and "autocast" in substituted
    assert "native_dropout" in substituted  # CUDA's dropout kernel on the CPU
    maxima = res["component_maxima"]
    assert maxima["logits"] > 0 and maxima["trainable_states"] > 0
    assert maxima["weights"] == res["components"]["params"]


def test_fake_trace_of_the_trainer_step_equals_the_cpu_steps():
    config = load("tiny-llama")
    cpu = run_probe(config, HF_LORA, [64, 128], steps=2, device="cpu")
    fake = run_probe(config, HF_LORA, [64, 128], steps=2, device="fake")
    for c, f in zip(cpu["results"], fake["results"], strict=True):
        assert c["status"] == f["status"] == "ok"
        # the Trainer's NaN filter (`logging_nan_inf_filter`, off under fake tensors because it
        # reads the loss) allocates one scalar on the CPU: one 512-byte block
        assert abs(c["peak_allocated_bytes"] - f["peak_allocated_bytes"]) <= 512
        for kind in ("weights", "trainable_states", "logits"):
            assert c["component_maxima"][kind] == f["component_maxima"][kind], kind
    assert "fake tensors" in " ".join(fake["environment"]["substituted"])


def test_lora_dropout_keeps_more_activations_than_no_dropout():
    config = load("tiny-llama")
    base = {**HF_LORA, "grad_accum": 1}
    plain = run_probe(config, {**base, "lora_dropout": 0.0}, [128], steps=2, device="fake")
    dropped = run_probe(config, base, [128], steps=2, device="fake")
    a0 = plain["results"][0]["component_maxima"]["activations"]
    a1 = dropped["results"][0]["component_maxima"]["activations"]
    assert a1 > a0  # peft's dropout keeps the dropped input of each adapted Linear


def test_full_fine_tune_under_mixed_precision_keeps_fp32_weights():
    config = load("tiny-llama")
    setup = {"stack": "hf", "method": "full", "precision": "mixed", "checkpointing": "gpu"}
    doc = run_probe(config, setup, [64], steps=2, device="fake")
    res, n = doc["results"][0], doc["model"]["params_total"]
    assert res["status"] == "ok"
    assert res["component_maxima"]["weights"] >= 4 * n  # AMP: fp32 weights, bf16 autocast
    assert res["component_maxima"]["trainable_states"] >= 12 * n  # fp32 grads + 2 AdamW states


def test_qlora_runs_bitsandbytes_4bit_on_the_cpu():
    pytest.importorskip("bitsandbytes")
    config = load("tiny-llama")
    setup = {**HF_LORA, "method": "qlora", "optimizer": "adamw-8bit", "grad_accum": 1}
    doc = run_probe(config, setup, [64], steps=1, device="cpu")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    ran = " ".join(doc["environment"]["ran"])
    assert "Linear4bit" in ran and "prepare_model_for_kbit_training" in ran
    assert "adamw_bnb_8bit" in ran
    # peft's kbit preparation casts the unquantised embedding and LM head to fp32; the NF4
    # Linear layers pack two weights per byte, far below bf16's 2 bytes per parameter
    embed_and_head = 2 * config["vocab_size"] * config["hidden_size"]
    linear = doc["model"]["params_total"] - embed_and_head - doc["model"]["params_trainable"]
    weights = res["component_maxima"]["weights"]
    assert 4 * embed_and_head <= weights < 4 * embed_and_head + 2 * linear


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (["--stack", "unsloth"], "setup.stack", "not runnable here"),
        (["--stack", "torchtitan", "--method", "lora"], "setup.method", "all weights"),
        (["--stack", "hf", "--checkpointing", "selective"], "setup.checkpointing", "torchtitan"),
        (
            ["--stack", "hf", "--loss", "chunked", "--loss-chunk", "256"],
            "setup.loss_chunk",
            "no setting",
        ),
        (["--stack", "hf", "--loss", "liger"], "setup.loss", "CUDA"),
        (["--stack", "hf", "--checkpointing", "offload"], "setup.checkpointing", "offload"),
        (["--stack", "hf", "--method", "qlora", "--device", "fake"], "setup.method", "fake"),
        (["--lora-dropout", "0.05"], "setup.lora_dropout", "--stack hf"),
        (["--stack", "hf", "--lora-dropout", "1.5"], "setup.lora_dropout", "[0, 1)"),
        (["--stack", "hf", "--grad-accum", "0"], "setup.grad_accum", "between"),
    ],
)
def test_setups_a_stack_cannot_run_exit_2_naming_the_field(
    args, field, words, configs_dir, tmp_path, capsys
):
    base = ["--config", str(configs_dir / "tiny-llama.json"), "--sweep", "32", "--no-progress"]
    if "--device" not in args:
        base += ["--device", "cpu"]
    rc = main([*base, *args, "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT
    assert f"{field}:" in err and words in err
    assert not (tmp_path / "m.json").exists()


def test_memtests_without_the_stack_fields_stay_valid(tiny_llama):
    doc = run_probe(tiny_llama, {"checkpointing": "none"}, [32], steps=1, device="fake")
    for key in ("stack", "autocast", "lora_dropout", "grad_accum"):
        doc["setup"].pop(key)
    for key in ("stack", "libraries", "ran", "substituted"):
        doc["environment"].pop(key)
    doc["results"][0].pop("component_maxima")
    assert load_memtest(json.dumps(doc))["setup"]["method"] == "full"
