"""The house rules, checked on the source: the import graph equals docs/architecture.md's
diagrams, the estimator imports no web framework or torch, and no estimator function takes
more than seven parameters."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("trainfit", "app", "templates", "estimator", "gpu_catalog", "memtest_schema", "probe")
MAX_PARAMS = 7


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path) -> list[str]:
    """Modules imported anywhere in the file (functions included), except type-checking-only."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found.extend(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for module in _imports(path):
                top = module.split(".")[0]
                if top in PACKAGES and top != pkg:
                    graph[pkg].add(top)
    return graph


def _doc_block(pattern: str) -> list[str]:
    for block in re.findall(r"```text\n(.*?)```", DOC, re.S):
        if re.search(pattern, block, re.M):
            return [line for line in block.splitlines() if line.strip()]
    raise AssertionError(f"docs/architecture.md has no diagram matching {pattern!r}")


def test_package_imports_equal_the_documented_arrows() -> None:
    documented = {}
    for line in _doc_block(r"^estimator -> "):
        left, _, right = line.partition("->")
        documented[left.strip()] = set(right.split())
    assert documented == _package_graph()


def test_estimator_never_imports_the_service_the_probe_or_the_front_door() -> None:
    assert not _package_graph()["estimator"] & {"app", "probe", "trainfit"}


def _estimator_module(path: Path) -> str:
    rel = path.relative_to(ROOT / "estimator")
    return rel.parts[0].removesuffix(".py")


def _estimator_layers() -> dict[str, int]:
    layers = {}
    for line in _doc_block(r"^layer 0 "):
        head, _, names = line.partition(":")
        number = int(head.split()[1])
        layers.update(dict.fromkeys(names.split(), number))
    return layers


def test_estimator_imports_point_down_the_documented_layers() -> None:
    layers = _estimator_layers()
    modules = {
        _estimator_module(p) for p in (ROOT / "estimator").rglob("*.py") if p.name != "__init__.py"
    }
    modules -= {"presets", "profiles", "stacks"} - set(layers)  # data folders
    assert modules - set(layers) == set(), "modules missing from docs/architecture.md's layers"
    wrong: defaultdict[str, set[str]] = defaultdict(set)
    for path in (ROOT / "estimator").rglob("*.py"):
        if path == ROOT / "estimator" / "__init__.py":
            continue
        src = _estimator_module(path)
        for module in _imports(path):
            parts = module.split(".")
            if parts[0] != "estimator" or len(parts) < 2 or parts[1] not in layers:
                continue
            dst = parts[1]
            if dst == src:
                continue
            if layers[dst] > layers[src] or (layers[dst] == layers[src] == 2):
                wrong[src].add(dst)
    assert dict(wrong) == {}


def test_importing_the_estimator_loads_no_web_framework_and_no_torch() -> None:
    code = (
        "import importlib, pkgutil, sys, estimator\n"
        "for m in pkgutil.walk_packages(estimator.__path__, 'estimator.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in ('torch', 'fastapi', 'starlette', 'sqlalchemy', 'app', 'probe')"
        " if n in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def _parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    count = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_estimator_function_takes_more_than_seven_parameters() -> None:
    long = []
    for path in (ROOT / "estimator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _parameter_count(node)
                if n > MAX_PARAMS:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert long == []


@pytest.mark.parametrize("rule", ["package", "layers"])
def test_the_checks_above_can_fail(rule: str, tmp_path: Path) -> None:
    """A made-up violation is caught: the parser sees function-level imports."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from app.server import serve\n    import estimator.time.step\n")
    found = _imports(bad)
    assert "app.server" in found and "estimator.time.step" in found
