"""Real training steps of tiny models on the CPU, measured by the storage tracker."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from memtest_schema import validate_memtest  # noqa: E402
from probe import run_probe  # noqa: E402
from tests.probe.conftest import load  # noqa: E402


def test_real_cpu_steps_of_two_lengths_write_a_schema_valid_memtest(tiny_llama):
    doc = run_probe(tiny_llama, {"checkpointing": "none"}, [64, 128], steps=2, device="cpu")
    validate_memtest(doc)
    assert doc["environment"]["device"] == "cpu"
    assert doc["environment"]["memory_counter"] == "storage_tracker"
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    short, long = doc["results"]
    assert short["steps"] == 2 and len(short["step_seconds"]) == 2
    assert long["peak_allocated_bytes"] > short["peak_allocated_bytes"]
    assert short["tokens_per_second"] > 0
    # mixed precision full fine-tune: bf16 weights, fp32 masters + two fp32 AdamW states
    n = doc["model"]["params_total"]
    comps = long["components"]
    assert comps["params"] >= 2 * n
    assert comps["optimizer"] >= 12 * n
    assert (
        sum(comps[k] for k in ("params", "grads", "optimizer", "activations"))
        == long["peak_allocated_bytes"]
    )


def test_injected_oom_stops_the_sweep_and_skips_the_rest(tiny_llama):
    first = run_probe(tiny_llama, {}, [64], steps=2, device="cpu")
    cap = first["results"][0]["peak_allocated_bytes"] + 1  # 64 fits, 256 cannot
    doc = run_probe(tiny_llama, {}, [64, 256, 512], steps=2, device="cpu", memory_cap=cap)
    statuses = [r["status"] for r in doc["results"]]
    assert statuses == ["ok", "oom", "skipped"]
    oom = doc["results"][1]
    assert "out of memory" in oom["error"]
    assert oom["tokens_per_second"] is None
    assert "stopped at oom" in doc["results"][2]["error"]


def test_lora_trains_only_the_adapters_in_fp32_by_default(tiny_llama):
    doc = run_probe(
        tiny_llama,
        {"method": "lora", "lora_rank": 4, "lora_targets": ["q_proj", "v_proj"]},
        [64],
        steps=1,
        device="cpu",
    )
    hidden, layers = tiny_llama["hidden_size"], tiny_llama["num_hidden_layers"]
    kv = hidden // tiny_llama["num_attention_heads"] * tiny_llama["num_key_value_heads"]
    expected = layers * 4 * ((hidden + hidden) + (hidden + kv))
    assert doc["model"]["params_trainable"] == expected
    assert doc["results"][0]["status"] == "ok"


def test_unsupported_optimizer_is_a_recorded_error_not_a_crash(tiny_llama):
    doc = run_probe(tiny_llama, {"optimizer": "adamw-8bit"}, [64, 128], device="cpu")
    first, second = doc["results"]
    assert first["status"] == "error" and "not supported here" in first["error"]
    assert second["status"] == "skipped"


def test_qlora_off_cuda_is_a_recorded_error(tiny_llama):
    doc = run_probe(tiny_llama, {"method": "qlora"}, [64], device="cpu")
    assert doc["results"][0]["status"] == "error"
    assert "not supported here" in doc["results"][0]["error"]


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum", "adafactor", "lion"])
def test_each_optimizer_runs_and_its_state_is_counted(tiny_llama, optimizer):
    doc = run_probe(
        tiny_llama, {"optimizer": optimizer, "precision": "bf16"}, [32], steps=2, device="cpu"
    )
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    state = res["components"]["optimizer"]
    n = doc["model"]["params_total"]
    if optimizer == "sgd":
        assert state == 0
    elif optimizer in ("sgd-momentum", "lion"):
        assert state >= 2 * n  # one bf16 buffer per parameter
    else:
        assert 0 < state < 2 * n  # factored moments


def test_offloaded_checkpoints_leave_the_device_and_count_as_host(tiny_llama):
    on_gpu = run_probe(tiny_llama, {"checkpointing": "gpu"}, [512], steps=1, device="cpu")
    offload = run_probe(tiny_llama, {"checkpointing": "offload"}, [512], steps=1, device="cpu")
    assert offload["results"][0]["host_bytes"] > 0
    assert on_gpu["results"][0]["host_bytes"] == 0


def test_chunked_loss_needs_less_memory_than_full_logits():
    cfg = load("tiny-qwen3")
    setup = {"method": "lora", "checkpointing": "gpu", "precision": "bf16"}
    full = run_probe(cfg, {**setup, "loss": "full"}, [1024], steps=1, device="cpu")
    chunked = run_probe(
        cfg, {**setup, "loss": "chunked", "loss_chunk": 128}, [1024], steps=1, device="cpu"
    )
    assert chunked["results"][0]["status"] == "ok"
    assert (
        chunked["results"][0]["peak_allocated_bytes"] < full["results"][0]["peak_allocated_bytes"]
    )


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3-moe", "tiny-gpt2", "tiny-qwen3.5"])
def test_tiny_architectures_train_for_real_on_the_cpu(name):
    doc = run_probe(load(name), {"method": "lora"}, [32], steps=1, device="cpu")
    assert doc["results"][0]["status"] == "ok", doc["results"][0]["error"]
    assert doc["model"]["params_trainable"] > 0


@pytest.mark.parametrize("method", ["full", "lora"])
def test_builtin_decoder_runs_without_transformers(tiny_llama, monkeypatch, method):
    monkeypatch.setenv("TRAINFIT_PROBE_BUILTIN", "1")
    doc = run_probe(tiny_llama, {"method": method, "checkpointing": "gpu"}, [64], device="cpu")
    assert doc["results"][0]["status"] == "ok", doc["results"][0]["error"]
    assert any("plain-torch" in note for note in doc["notes"])
    # same parameter count as transformers' LlamaForCausalLM for the same config
    monkeypatch.delenv("TRAINFIT_PROBE_BUILTIN")
    hf = run_probe(tiny_llama, {"method": method}, [16], steps=1, device="cpu")
    if method == "full":
        assert doc["model"]["params_total"] == hf["model"]["params_total"]


@pytest.mark.parametrize("stack", ["hf", "probe"])
def test_a_model_without_an_sdpa_path_runs_eager_as_transformers_picks(stack):
    """Gemma 2 has no SDPA path (modeling_gemma2.py `_supports_sdpa = False`): asking
    transformers for sdpa raised, so the probe could not measure it; the Trainer runs it
    eager, and so does the probe now, saying so."""
    import json
    from pathlib import Path

    config = json.loads(
        (Path(__file__).parents[2] / "bench" / "configs" / "small-gemma2.json").read_text()
    )
    doc = run_probe(config, {"stack": stack, "method": "lora"}, [32], steps=1, device="cpu")
    assert doc["results"][0]["status"] == "ok", doc["results"][0]["error"]
    assert any("ran eager" in note for note in doc["notes"])
