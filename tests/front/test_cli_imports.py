"""Import budget of the command line (issue 17: `trainfit --help` <= 0.08 s, a one-preset
one-GPU `trainfit estimate` <= 0.15 s): which heavy modules a fresh interpreter loads. A
module on the list below is a start-up cost every run pays; this fails when one comes back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainfit.cli.common import terminal_columns

ROOT = Path(__file__).parents[2]
HEAVY = ("numpy", "pydantic", "pydantic_core", "gpu_catalog.schema", "estimator.request")
HELP_HEAVY = (*HEAVY, "dataclasses", "shutil", "estimator.document")
RUN = """
import json, runpy, sys
sys.argv = ["trainfit", *{args!r}]
try:
    runpy.run_module("trainfit", run_name="__main__")
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _loaded(*args: str, heavy: tuple[str, ...] = HEAVY) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = RUN.format(args=list(args), heavy=heavy)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.splitlines()[-1])
    return result["code"], result["loaded"]


def test_help_loads_no_heavy_module() -> None:
    assert _loaded("--help", heavy=HELP_HEAVY) == (0, [])


@pytest.mark.parametrize("columns", [None, "50", "200", "0", "wide"])
def test_help_width_is_shutil_s(columns: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The formatters' width without shutil is shutil's (the help text wraps as before)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns


def test_one_preset_on_one_gpu_estimate_loads_no_heavy_module() -> None:
    """No numpy (one length: Python floats), no pydantic (`estimator.plain_request`), no
    catalog schema (`gpu_catalog.card`)."""
    code, loaded = _loaded("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb")
    assert (code, loaded) == (0, [])
    args = ("estimate", "--model", "qwen3-8b", "--method", "qlora", "--gpu", "h200,2xh200")
    assert _loaded(*args, "--format", "json") == (0, [])


def test_check_on_one_gpu_loads_no_heavy_module() -> None:
    code, loaded = _loaded("check", "--model", "llama-3.1-8b", "--method", "lora", "--gpu", "h200")
    assert (code, loaded) == (0, [])


def test_bad_input_still_gets_pydantic_s_message() -> None:
    """A value the plain request does not vouch for goes to the pydantic model (exit 2)."""
    code, loaded = _loaded("estimate", "--model", "llama-3.1-8b", "--lora-rank", "0")
    assert code == 2
    assert "pydantic" in loaded


def test_several_lengths_still_compute_with_numpy() -> None:
    """The seam is lazy, not removed: arrays (several lengths) load numpy."""
    code, loaded = _loaded("estimate", "--model", "llama-3.1-8b", "--seq", "1024,8192")
    assert code == 0
    assert "numpy" in loaded
