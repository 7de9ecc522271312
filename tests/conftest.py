from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA


# a local Hub (HTTP endpoint on 127.0.0.1 + a cache directory) for the Hub-id tests
from tests.estimator.hub_server import endpoint, hub_env  # noqa: E402, F401
