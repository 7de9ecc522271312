"""Import budget of the command line (issue 17: `trainfit --help` <= 0.08 s, a one-preset
one-GPU `trainfit estimate` <= 0.15 s): which heavy modules a fresh interpreter loads. A
module on the list below is a start-up cost every run pays; this fails when one comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
HEAVY = ("numpy", "pydantic", "pydantic_core", "gpu_catalog.schema", "estimator.request")
RUN = """
import json, runpy, sys
sys.argv = ["trainfit", *{args!r}]
try:
    runpy.run_module("trainfit", run_name="__main__")
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def _loaded(*args: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = RUN.format(args=list(args), heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.splitlines()[-1])
    return result["code"], result["loaded"]


def test_help_loads_no_heavy_module() -> None:
    assert _loaded("--help") == (0, [])


def test_one_preset_on_one_gpu_estimate_loads_no_numpy() -> None:
    code, loaded = _loaded("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-80gb")
    assert code == 0
    assert "numpy" not in loaded
    assert "gpu_catalog.schema" not in loaded


def test_several_lengths_still_compute_with_numpy() -> None:
    """The seam is lazy, not removed: arrays (several lengths) load numpy."""
    code, loaded = _loaded("estimate", "--model", "llama-3.1-8b", "--seq", "1024,8192")
    assert code == 0
    assert "numpy" in loaded
