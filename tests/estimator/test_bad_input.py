"""A corpus of malformed configs and options: each gives exit code 2 and a message that names
the field, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.cli import main

LLAMA = json.loads(
    (
        Path(__file__).parents[1] / "data" / "reference_configs" / "meta-llama_Llama-3.1-8B.json"
    ).read_text()
)
QWEN35 = json.loads(
    (Path(__file__).parents[1] / "data" / "reference_configs" / "qwen3.5-27b.json").read_text()
)


def _config(**changes: object) -> dict:
    config = dict(LLAMA)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    return config


CONFIG_CASES = [
    ("unknown model_type", _config(model_type="bert"), "config.model_type"),
    ("missing model_type", _config(model_type=...), "config.model_type"),
    ("negative layers", _config(num_hidden_layers=-2), "config.num_hidden_layers"),
    ("zero hidden", _config(hidden_size=0), "config.hidden_size"),
    ("10^15 layers", _config(num_hidden_layers=10**15), "config.num_hidden_layers"),
    ("string hidden", _config(hidden_size="4096"), "config.hidden_size"),
    ("boolean vocab", _config(vocab_size=True), "config.vocab_size"),
    ("fractional heads", _config(num_attention_heads=31.5), "config.num_attention_heads"),
    ("missing vocab", _config(vocab_size=...), "config.vocab_size"),
    (
        "more heads than hidden",
        _config(num_attention_heads=8192, head_dim=..., hidden_size=4096),
        "config.num_attention_heads",
    ),
    ("qwen3_5 without text_config", {"model_type": "qwen3_5"}, "config.text_config"),
    (
        "layer_types of wrong length",
        {**QWEN35, "text_config": {**QWEN35["text_config"], "layer_types": ["full_attention"]}},
        "config.text_config.layer_types",
    ),
    ("top level is a list", [1, 2, 3], "config"),
    ("tie flag not a bool", _config(tie_word_embeddings="yes"), "config.tie_word_embeddings"),
]


@pytest.mark.parametrize("name,config,field", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_exits_2_naming_the_field(tmp_path, capsys, name, config, field) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["estimate", "--model", str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainfit: error: ") and field in err
    assert "Traceback" not in err


OPTION_CASES = [
    ("malformed json", ["--model", "{bad"], "--model"),
    ("unknown preset", ["--model", "no-such-model"], "model.preset"),
    ("unknown gpu", ["--model", "gpt2", "--gpu", "h900"], "gpus[0]"),
    ("bad gpu count", ["--model", "gpt2", "--gpu", "0xh200"], "gpus[0]"),
    ("seq zero", ["--model", "gpt2", "--seq", "0"], "seq_lens"),
    ("seq absurd", ["--model", "gpt2", "--seq", "1000000000000"], "seq_lens"),
    ("seq not a number", ["--model", "gpt2", "--seq", "16k"], "--seq"),
    ("batch zero", ["--model", "gpt2", "--batch", "0"], "setup.batch"),
    ("negative params", ["--params", "-5"], "model.params"),
    ("no model", [], "model"),
    (
        "unknown target",
        ["--model", "llama-3.1-8b", "--method", "lora", "--lora-targets", "in_proj_qkv"],
        "setup.lora_targets",
    ),
    (
        "rank above targets",
        ["--model", "gpt2", "--method", "lora", "--lora-rank", "60000", "--lora-targets", "c_attn"],
        "setup.lora_rank",
    ),
    ("usable above 1", ["--model", "gpt2", "--usable", "1.5"], "usable_fraction"),
    ("unknown profile", ["--model", "gpt2", "--profile", "optimistic"], "profile"),
    ("bad checkpointing", ["--model", "gpt2", "--checkpointing", "disk"], "--checkpointing"),
    ("lora on params-only", ["--params", "8e9", "--method", "lora"], "setup.lora_targets"),
    (
        "adafactor on params-only",
        ["--params", "8e9", "--optimizer", "adafactor"],
        "setup.optimizer",
    ),
]


@pytest.mark.parametrize("name,args,field", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_bad_option_exits_2_naming_the_field(tmp_path, capsys, name, args, field) -> None:
    args = [str(tmp_path / "bad.json") if a == "{bad" else a for a in args]
    if "{bad" in [a for _, a2, _ in OPTION_CASES for a in a2] and name == "malformed json":
        (tmp_path / "bad.json").write_text("{bad")
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_check_exit_codes(capsys) -> None:
    common = ["check", "--model", "gpt2", "--seq", "1024"]
    assert main([*common, "--gpu", "h200"]) == 0
    assert main(["check", "--model", "llama-3.1-70b", "--seq", "4096", "--gpu", "rtx-3060"]) == 1
    assert main([*common, "--gpu", "nope"]) == 2
