"""The service freezes its start-up objects (`gc.freeze`, app/factory.py): a full collection
afterwards walks only what requests made since, and requests still collect their own cycles."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import make_settings

from app.factory import create_app

BODY = {
    "model": {"preset": "llama-3.1-8b"},
    "setup": {"method": "lora"},
    "seq_lens": [4096],
    "gpus": ["h100-80gb"],
}


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # no test after this one inherits a frozen heap


def test_start_up_objects_are_frozen(tmp_path: Any, unfrozen: None) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'db'}")
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(settings)) as client:
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the imports' objects, not a handful
        assert client.post("/v1/estimate", json=BODY).status_code == 200
        before = len(gc.get_objects())
        assert before < frozen  # what a full collection walks is no longer the start-up's


def test_gc_freeze_off_leaves_the_heap_to_the_collector(tmp_path: Any, unfrozen: None) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'db'}", gc_freeze=False)
    with TestClient(create_app(settings)) as client:
        assert gc.get_freeze_count() == 0
        assert client.get("/healthz").status_code == 200


def test_request_cycles_are_still_collected(tmp_path: Any, unfrozen: None) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'db'}")
    with TestClient(create_app(settings)):

        class Node:
            other: Any = None

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after start-up
        del a, b
        assert gc.collect() >= 2
