"""The probe hands trainfit's `re:` LoRA targets to peft as peft's own string `target_modules`
(probe.model.peft_target_modules), and its built-in LoRA (no peft) matches them the same way."""

from __future__ import annotations

import re

import pytest

from probe.model import peft_target_modules

NAMES = [
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.1.mlp.up_proj",
    "model.layers.1.mlp.up_proj_extra",
    "lm_head",
]


def _peft_hits(target: str | list[str]) -> list[str]:
    """peft's rule (tuners_utils.check_target_module_exists): a string is re.fullmatch'ed, a
    list entry matches the whole name or a dotted suffix."""
    if isinstance(target, str):
        return [n for n in NAMES if re.fullmatch(target, n)]
    return [n for n in NAMES if n in target or any(n.endswith("." + t) for t in target)]


def test_names_stay_a_list_and_all_linear_stays_itself() -> None:
    assert peft_target_modules(["q_proj", "v_proj"]) == ["q_proj", "v_proj"]
    assert peft_target_modules(["all-linear"]) == "all-linear"


def test_a_regex_target_is_passed_as_peft_s_string() -> None:
    target = peft_target_modules([r"re:model\.layers\.\d+\.self_attn\.(q|v)_proj"])
    assert _peft_hits(target) == NAMES[:2]


def test_names_beside_a_regex_keep_peft_s_suffix_rule() -> None:
    target = peft_target_modules([r"re:model\.layers\.0\.self_attn\.q_proj", "up_proj"])
    assert isinstance(target, str)
    assert _peft_hits(target) == [NAMES[0], NAMES[2]]  # up_proj_extra is not up_proj


def test_the_builtin_lora_matches_a_regex_over_whole_module_names() -> None:
    torch = pytest.importorskip("torch")
    from probe.builtin import LoRALinear, apply_builtin_lora

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)
            self.v_proj = torch.nn.Linear(4, 4)

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Block(), Block()])
    apply_builtin_lora(model, 2, 2.0, r"layers\.1\.(q|v)_proj", fp32=True)
    wrapped = [n for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    assert wrapped == ["layers.1.q_proj", "layers.1.v_proj"]


def test_a_probe_run_with_a_regex_target_trains_what_the_names_train(tiny_llama):
    pytest.importorskip("torch")
    from probe import run_probe

    def trainable(targets: list[str]) -> int:
        setup = {"method": "lora", "lora_rank": 4, "lora_targets": targets}
        doc = run_probe(tiny_llama, setup, [64], steps=1, device="cpu")
        assert doc["results"][0]["status"] == "ok"
        return int(doc["model"]["params_trainable"])

    regex = r"re:model\.layers\.\d+\.self_attn\.(q|v)_proj"
    assert trainable([regex]) == trainable(["q_proj", "v_proj"]) > 0
