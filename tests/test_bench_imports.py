"""Every `from estimator... import name` / `from probe... import name` / `from app... import
name` in bench/ names something that exists, including the imports inside functions, which
importing a bench module does not run (a rename once left three benches failing only when they
reached the estimator)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("estimator", "probe", "app", "gpu_catalog", "trainfit")


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] in OURS:
                found += [(path.name, node.module, a.name) for a in node.names]
    return found


IMPORTS = _imports()


def test_the_benches_import_from_the_project() -> None:
    assert len(IMPORTS) > 50


@pytest.mark.parametrize(("bench", "module", "name"), IMPORTS)
def test_each_imported_name_exists(bench: str, module: str, name: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError as err:  # an optional extra (torch, transformers) not installed here
        pytest.skip(f"{module}: {err}")
    if name == "*" or hasattr(mod, name):
        return
    try:  # a submodule imported by name
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        pytest.fail(f"bench/{bench}: `from {module} import {name}`: no such name")
