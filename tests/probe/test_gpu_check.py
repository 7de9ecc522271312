"""bench/gpu_check.sh is valid bash and names configs and options that exist.

The full dry run (`PYTHON=.venv/bin/python bench/gpu_check.sh --dry-run`, about a minute on two
cores) is not run here, to keep this folder fast; the probe commands it uses are exercised by the
CLI tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_gpu_check_configs_exist():
    text = SCRIPT.read_text()
    configs = re.findall(r"tests/data/configs/[\w.\-]+\.json", text)
    assert len(configs) >= 4
    for config in configs:
        assert (ROOT / config).is_file(), config


def test_gpu_check_uses_only_options_the_probe_knows():
    from probe.cli import build_parser

    known = {s for a in build_parser()._actions for s in a.option_strings}
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", SCRIPT.read_text()))
    # the script's own, timeout's, pip's
    not_probe = {"--dry-run", "--kill-after", "--no-index", "--no-deps", "--no-compile", "--target"}
    assert used - not_probe <= known


def test_gpu_check_runs_the_hf_stack_and_liger_and_records_unsloth():
    text = SCRIPT.read_text()
    assert text.count("--stack hf") >= 2  # the seed case and Llama-3.1-8B LoRA
    assert "--lora-dropout 0.05" in text and "--grad-accum 2" in text
    assert "--loss liger" in text
    assert "import unsloth" in text


def test_gpu_check_limits_fit_the_gpu_budget_and_leave_positive_soft_limits():
    text = SCRIPT.read_text()
    arrays = re.findall(r"LIMITS=\(([\d ]+)\)", text)
    assert len(arrays) == 2  # dry run, GPU
    gpu = [int(x) for x in arrays[1].split()]
    assert len(gpu) == len([int(x) for x in arrays[0].split()]) == text.count('"${LIMITS[')
    assert sum(gpu) <= 7 * 60  # /work/shared/gpu-check.md: under 7 minutes of GPU time
    assert "--time-limit $((limit * 2 / 3))" in text  # a soft limit > 0 for every hard limit
    assert min(gpu) >= 2


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_only_runs_the_named_steps_and_limit_overrides_a_hard_limit(tmp_path):
    """A rerun in the device time that is left: ONLY names the steps, LIMIT_<name> their limits."""
    import os
    import sys

    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "ONLY": "torch-info dense-full",
        "LIMIT_dense_full": "7",
        "LIMIT_torch_info": "60",
    }
    out = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    ).stdout
    summary = (tmp_path / "summary.log").read_text()
    assert "torch-info rc=0" in summary
    assert "seed-gpu-chunked: skipped (not in ONLY)" in summary
    assert "hf-llama-lora: skipped (not in ONLY)" in summary
    assert "--time-limit 4 " in out  # 2/3 of LIMIT_dense_full=7, not of the default 90
    assert "dense-full rc=" in summary


def test_fla_warmup_takes_the_value_heads_and_exits_2_without_what_it_needs(tmp_path):
    import json
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import fla_warmup

    seed = json.loads((ROOT / "tests/data/configs/qwen3.5-27b.json").read_text())
    assert fla_warmup._shapes(seed) == (48, 128, 128)  # q, k repeated to the value heads
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        fla_warmup._shapes(json.loads((ROOT / "tests/data/configs/tiny-llama.json").read_text()))
    dense = str(ROOT / "tests/data/configs/tiny-llama.json")
    assert fla_warmup.main([dense]) == 2
