"""`--stack torchtune`: steps run by torchtune's own single-device recipes on the CPU.

Needs the `torchtune` extra (torchtune 0.6.1 + torchao 0.11); without it the recipe tests skip
and the CLI must exit 2 naming `setup.stack`.
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
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--precision", "mixed"], "setup.precision"),
        (["--autocast"], "setup.autocast"),
        (["--device", "fake"], "device"),
        (["--method", "lora", "--adapter-dtype", "fp32"], "setup.adapter_dtype"),
        (["--method", "qlora"], "setup.method"),
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
