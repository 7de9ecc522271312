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
    not_probe = {"--dry-run", "--kill-after", "--no-index", "--find-links"}  # script, timeout, pip
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
