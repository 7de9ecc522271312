"""The README's shown outputs are what the commands print today (scripts/readme_outputs.py):
the notebook API block, the training-config CI gate with its exit codes, the dataset counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "readme_outputs", ROOT / "scripts" / "readme_outputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_outputs"] = module
    spec.loader.exec_module(module)
    return module


def test_readme_outputs_are_what_the_commands_print() -> None:
    script = _script()
    text = script.README.read_text()
    markers = [line for line in text.splitlines() if script.MARKER.match(line)]
    assert len(markers) >= 3  # notebook API, CI gate, dataset counts
    regenerated = script.regenerate(text)
    assert regenerated == text, "README outputs are stale: run scripts/readme_outputs.py --write"


def test_the_ci_gate_in_the_readme_shows_both_exit_codes() -> None:
    script = _script()
    text = script.README.read_text()
    blocks = [
        part.split("```", 1)[0]
        for part in text.split("<!-- readme-output: console -->\n```console\n")[1:]
    ]
    gates = [b for b in blocks if b.startswith("$ trainfit check ")]
    assert len(gates) == 1
    lines = gates[0].splitlines()
    commands = [c for _, c in script._commands(lines)]
    assert commands[0].startswith("trainfit check --train-config examples/train_configs/")
    assert "--gpu h100-80gb" in commands[0]
    shown_codes = [lines[n + 1] for n, line in enumerate(lines) if line == "$ echo $?"]
    assert shown_codes == ["0", "1"]  # fits, then does not fit (re-run above)
