"""Shared fixtures for the probe tests (all run on the CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def load(name: str) -> dict[str, Any]:
    """A config from tests/data/configs by file stem."""
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.fixture
def tiny_llama() -> dict[str, Any]:
    return load("tiny-llama")


@pytest.fixture
def configs_dir() -> Path:
    return CONFIGS
