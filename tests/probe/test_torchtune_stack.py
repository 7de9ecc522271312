"""`--stack torchtune`: steps run by torchtune's own single-device recipes on the CPU.

Needs the `torchtune` extra (torchtune 0.6.1 + torchao 0.11), which `make setup` installs in
`.venv-torchtune` (peft refuses LoRA beside that torchao) and `make test` runs this file with;
without it the recipe tests skip and the CLI must exit 2 naming `setup.stack`.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from memtest_schema import load_memtest  # noqa: E402
from probe.cli import EXIT_BAD_INPUT, EXIT_OK, main  # noqa: E402

HAS_TORCHTUNE = importlib.util.find_spec("torchtune") is not None
needs_torchtune = pytest.mark.skipif(not HAS_TORCHTUNE, reason="torchtune extra not installed")


def _run(tmp_path, configs_dir, *extra: str) -> tuple[int, dict | None]:
    out = tmp_path / "m.json"
    rc = main(
        [
            "--config", str(configs_dir / "tiny-llama.json"),
            "--stack", "torchtune", "--device", "cpu", "--sweep", "64", "--steps", "1",
            "--out", str(out), "--no-progress", *extra,
        ]
    )  # fmt: skip
    return rc, (load_memtest(out.read_text()) if out.exists() else None)


@needs_torchtune
def test_cli_runs_one_lora_recipe_step_and_writes_a_memtest_naming_the_stack(tmp_path, configs_dir):
    rc, doc = _run(
        tmp_path, configs_dir,
        "--method", "lora", "--lora-rank", "4", "--lora-dropout", "0.05",
        "--grad-accum", "2", "--loss", "chunked", "--checkpointing", "gpu",
    )  # fmt: skip
    assert rc == EXIT_OK and doc is not None
    env, setup, res = doc["environment"], doc["setup"], doc["results"][0]
    assert res["status"] == "ok", res["error"]
    assert res["steps"] == 1  # one optimizer step = two micro-batches, one log_dict
    assert setup["stack"] == "torchtune" and env["stack"] == "torchtune"
    # torchtune's recipes: model dtype bf16, adapters in it, no autocast
    assert setup["precision"] == "bf16" and setup["adapter_dtype"] == "bf16"
    assert setup["autocast"] is False and setup["grad_accum"] == 2
    libs = env["libraries"]
    assert libs["torchtune"] and libs["torchao"] and libs["omegaconf"]
    ran = " ".join(env["ran"])
    assert "LoRAFinetuneRecipeSingleDevice" in ran and "gradient_accumulation_steps=2" in ran
    assert "CEWithChunkedOutputLoss" in ran and "lora_dropout=0.05" in ran
    substituted = " ".join(env["substituted"])
    assert "model.safetensors" in substituted and "tiktoken" in substituted
    assert "native_dropout" in substituted  # CUDA's dropout kernel on the CPU
    maxima = res["component_maxima"]
    assert maxima["weights"] == res["components"]["params"]
    assert maxima["logits"] > 0 and maxima["activations"] > 0
    # LoRA: the states are the adapters' (bf16 grads + two AdamW moments), far below weights
    assert 0 < maxima["trainable_states"] < maxima["weights"] // 4
    assert doc["model"]["params_trainable"] < doc["model"]["params_total"]


@needs_torchtune
def test_full_recipe_step_holds_gradients_and_adamw_moments_for_every_weight(tmp_path, configs_dir):
    rc, doc = _run(tmp_path, configs_dir, "--method", "full", "--checkpointing", "none")
    assert rc == EXIT_OK and doc is not None
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    assert "FullFinetuneRecipeSingleDevice" in " ".join(doc["environment"]["ran"])
    params = doc["model"]["params_total"]
    assert doc["model"]["params_trainable"] == params
    maxima = res["component_maxima"]
    # bf16 gradients + bf16 exp_avg and exp_avg_sq (torch AdamW keeps states in the param dtype)
    assert maxima["trainable_states"] >= 3 * 2 * params
    assert maxima["weights"] >= 2 * params


@needs_torchtune
def test_each_length_is_counted_alone_even_when_the_recipe_is_not_freed(tiny_llama):
    """An optimizer_in_bwd recipe is never freed (its per-parameter optimizers hang off its
    parameters' gradient hooks); the next length must not count its weights and states."""
    from probe import run_probe

    setup = {"stack": "torchtune", "method": "full", "optimizer_impl": "in-backward"}
    doc = run_probe(tiny_llama, setup, [32, 64], steps=1, device="cpu")
    first, second = (r["component_maxima"] for r in doc["results"])
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    assert second["weights"] == first["weights"]
    # twice the tokens at most doubles what the step makes (the leak made it 4.8x)
    assert second["activations"] <= 2 * first["activations"]


@needs_torchtune
def test_qlora_recipe_step_keeps_the_base_in_nf4():
    """lora_llama3_2(quantize_base=True): torchao NF4Tensor weights, counted by their inner
    tensors (packed 4-bit data + int8 scalers), well below the bf16 model's 2 bytes/param."""
    import json
    from pathlib import Path

    from probe import run_probe

    root = Path(__file__).resolve().parents[2]
    config = json.loads((root / "bench" / "configs" / "small-llama.json").read_text())
    setup = {"stack": "torchtune", "method": "qlora", "lora_rank": 8, "loss": "chunked"}
    doc = run_probe(config, setup, [64], steps=1, device="cpu")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    assert doc["setup"]["double_quant"] is True and doc["setup"]["kbit_prepare"] is False
    assert "NF4Tensor" in " ".join(doc["environment"]["ran"])
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    rope = config["max_position_embeddings"] * head_dim * 4 + 512  # cos/sin cache + theta
    embed_and_head = 2 * config["vocab_size"] * config["hidden_size"]  # bf16, not quantized
    linear = doc["model"]["params_total"] - embed_and_head - doc["model"]["params_trainable"]
    weights = res["component_maxima"]["weights"] - rope
    assert 2 * embed_and_head + linear // 2 <= weights < 2 * embed_and_head + linear


@needs_torchtune
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--precision", "mixed"], "setup.precision"),
        (["--autocast"], "setup.autocast"),
        (["--method", "lora", "--adapter-dtype", "fp32"], "setup.adapter_dtype"),
        (["--method", "qlora", "--precision", "fp32"], "setup.precision"),
        (["--method", "lora", "--optimizer-impl", "in-backward"], "setup.optimizer_impl"),
    ],
)
def test_what_the_recipes_cannot_run_exits_2_naming_the_field(
    tmp_path, configs_dir, capsys, args, field
):
    rc, doc = _run(tmp_path, configs_dir, *args)
    assert rc == EXIT_BAD_INPUT and doc is None
    assert f"error: {field}:" in capsys.readouterr().err


@pytest.mark.skipif(HAS_TORCHTUNE, reason="torchtune is installed")
def test_without_torchtune_the_cli_exits_2_naming_the_stack(tmp_path, configs_dir, capsys):
    rc, doc = _run(tmp_path, configs_dir)
    assert rc == EXIT_BAD_INPUT and doc is None
    assert "error: setup.stack:" in capsys.readouterr().err


@needs_torchtune
def test_fake_trace_of_the_recipe_step_equals_the_cpu_step(configs_dir):
    import json

    from probe import run_probe

    config = json.loads((configs_dir / "tiny-llama.json").read_text())
    setup = {
        "stack": "torchtune",
        "method": "lora",
        "lora_rank": 4,
        "lora_dropout": 0.05,
        "grad_accum": 2,
        "loss": "chunked",
    }
    cpu = run_probe(config, setup, [32], steps=1, device="cpu")
    fake = run_probe(config, setup, [32], steps=1, device="fake")
    c, f = cpu["results"][0], fake["results"][0]
    assert c["status"] == f["status"] == "ok", (c["error"], f["error"])
    assert f["peak_allocated_bytes"] == c["peak_allocated_bytes"]
    assert f["component_maxima"] == c["component_maxima"]
    assert "FakeCheckpointer" in " ".join(fake["environment"]["substituted"])


@needs_torchtune
def test_estimate_vs_the_lora_recipe_step_per_component():
    """The estimator's `--stack torchtune` against one real recipe step (small-llama, LoRA r8,
    bf16, fused AdamW, CEWithChunkedOutputLoss, activation checkpointing, 128 tokens).

    The bounds are the known, sourced differences, each worked out independently:
    - weights: torchtune's RoPE buffers, non-persistent fp32 `theta` (head_dim/2) and `cache`
      (max_seq_len x head_dim/2 x (cos, sin)) built with the model
      (models/llama3_1/_position_embeddings.py:62-101), which the estimator counts since
      i10tt (weights.rope_buffer_bytes): exact.
    - trainable states: fused AdamW keeps each parameter's `step` as a 0-dim fp32 tensor on the
      device (torch 2.13 torch/optim/adam.py:168-176), one 512-byte block per trained tensor,
      which the estimator counts since i10tt (states.step_tensor_bytes): exact.
    - logits: torchtune 0.6.1's CEWithChunkedOutputLoss takes the model's list of bf16 logit
      chunks (all alive, modules/transformer.py chunked_output), keeps every chunk's fp32
      log-softmax for the backward and upcasts one chunk at a time
      (modules/loss/ce_chunked_output_loss.py:35-43, 80-81): measured = that, exactly, and so
      is the estimate since it models 0.6.1 (before: main's LinearCrossEntropyLoss, lower).
    - activations: none known since i11tune (torchtune's k/v repeated for SDPA and the LoRA
      output projection's input being SDPA's output, activations.torchtune_modules); 2 %."""
    import json
    from pathlib import Path

    from estimator.architectures import spec_from_config
    from estimator.document import compare_memtest
    from estimator.memory.states import step_tensor_bytes
    from estimator.memory.weights import rope_buffer_bytes
    from estimator.setup import TrainingSetup
    from probe import run_probe

    torchtune = TrainingSetup(stack="torchtune", method="lora", lora_targets=["all-linear"])

    root = Path(__file__).resolve().parents[2]
    config = json.loads((root / "bench" / "configs" / "small-llama.json").read_text())
    setup = {"stack": "torchtune", "method": "lora", "lora_rank": 8, "loss": "chunked"}
    seq = 128
    doc = run_probe(config, setup, [seq], steps=1, device="cpu")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    row = compare_memtest(doc, "default")["rows"][0]
    measured, est = res["component_maxima"], row["estimated_components"]
    parts = row["components_vs_measured"]

    head_dim = config["hidden_size"] // config["num_attention_heads"]
    rope_cache = config["max_position_embeddings"] * (head_dim // 2) * 2 * 4
    theta = 512  # Llama3ScaledRoPE's `theta` buffer: head_dim/2 fp32 values, one block
    assert measured["weights"] == parts["params"]["estimated"]
    assert rope_cache + theta == rope_buffer_bytes(spec_from_config(config), torchtune)

    trained_tensors = 2 * 7 * config["num_hidden_layers"]  # lora_a, lora_b on 7 projections
    step_tensors = 512 * trained_tensors
    est_states = est["trainable_states"] - (parts["params"]["estimated"] - est["weights"])
    assert measured["trainable_states"] == est_states
    assert step_tensors == step_tensor_bytes(spec_from_config(config), torchtune)

    vocab, chunks = config["vocab_size"], 8
    held = seq * vocab * 2 + seq * vocab * 4 + (seq // chunks) * vocab * 4
    assert measured["logits"] == held
    # the estimator models 0.6.1's loss (estimator/memory/logits.py chunked_output_loss_bytes)
    # and its loss moment also holds the frozen last norm's fp32 input and rsqrt saved for the
    # head (head_input_saved), which it reports apart as not vocab-wide (`logits_other`), as
    # the tracker does not file them under logits
    head_input = seq * (4 * config["hidden_size"] + 4)
    # + the chunks' bf16 hidden-state gradients, the loss backward's own non-vocab most
    # (its matmul phase, estimator/memory/logits.py loss_backward_activations)
    hidden_grads = seq * config["hidden_size"] * 2
    assert row["estimated_logits_other"] == {"activations": head_input + hidden_grads}
    assert est["logits"] - head_input == measured["logits"]

    est_acts = est["checkpoints"] + est["recompute_peak"]
    assert abs(est_acts - measured["activations"]) <= 0.02 * measured["activations"]


def _estimate_vs_step(setup: dict, seq: int) -> tuple[dict, dict, dict]:
    """(measured component maxima, estimated kinds, compare row) of one recipe step of
    small-llama, the estimate mapped to the tracker's kinds as bench/accuracy.py does."""
    import json
    from pathlib import Path

    from bench.accuracy import _estimate_parts
    from estimator.document import compare_memtest
    from probe import run_probe

    root = Path(__file__).resolve().parents[2]
    config = json.loads((root / "bench" / "configs" / "small-llama.json").read_text())
    doc = run_probe(config, {"stack": "torchtune", **setup}, [seq], steps=2, device="cpu")
    res = doc["results"][0]
    assert res["status"] == "ok", res["error"]
    row = compare_memtest(doc, "default")["rows"][0]
    return res["component_maxima"], _estimate_parts(row, None), row


@needs_torchtune
def test_qlora_step_holds_torchaos_dequantized_weight_as_the_estimate_says():
    """QLoRA (torchao NF4): the recompute's down projection dequantizes its weight through
    torchao's get_original_weight, whose eight tensors (two int64 code arrays, ...) are alive
    together on the layer's saved tensors (estimator/memory/dequant.py). Without that term the
    estimate was 36 % under at 256 tokens; with it, within 1 %."""
    from estimator.memory.dequant import nf4_dequant_peak

    measured, est, _ = _estimate_vs_step({"method": "qlora", "lora_rank": 8}, 256)
    assert abs(est["activations"] - measured["activations"]) <= 0.01 * measured["activations"]
    # the transient is most of what QLoRA's activations hold at this length
    dequant = nf4_dequant_peak(256 * 704, 2)  # hidden x intermediate, bf16
    assert dequant > 0.35 * measured["activations"]


@needs_torchtune
def test_optimizer_in_bwd_gradients_count_as_gradients():
    """optimizer_in_bwd frees each gradient right after its optimizer steps, inside the
    backward; the probe notes each gradient as one when autograd hands it to its parameter,
    so trainable states hold the gradients alive at one moment (the estimator: the states +
    the largest gradient), not activations."""
    setup = {"method": "full", "optimizer_impl": "in-backward"}
    measured, est, _ = _estimate_vs_step(setup, 256)
    fused, _, _ = _estimate_vs_step({"method": "full"}, 256)
    states = est["trainable_states"]
    assert abs(states - measured["trainable_states"]) <= 0.005 * measured["trainable_states"]
    # the activations' most is that of the same step with a separate optimizer step
    assert measured["activations"] == fused["activations"]
