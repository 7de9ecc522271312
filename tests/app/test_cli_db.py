"""`trainfit db backup` / `restore` round-trips through the CLI."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.factory import create_app
from app.settings import Settings
from trainfit.cli import main


def test_db_backup_and_restore_round_trip(tmp_path: Path, capsys) -> None:
    source, target = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    tokens = {"requester_tokens": "alice=request-secret-8901"}
    auth = {"Authorization": "Bearer request-secret-8901"}
    with TestClient(create_app(Settings(database_url=source, **tokens))) as client:
        body = {
            "request": {"model": {"preset": "gpt2"}, "seq_lens": [1024], "gpus": ["h200"]},
            "title": "round trip",
        }
        assert client.post("/v1/quotes", json=body, headers=auth).status_code == 201
    backup_file = str(tmp_path / "trainfit.bak")
    assert main(["db", "backup", backup_file, "--database-url", source]) == 0
    assert main(["db", "restore", backup_file, "--database-url", target]) == 0
    assert "quotes 1" in capsys.readouterr().out
    with TestClient(create_app(Settings(database_url=target, **tokens))) as client:
        quotes = client.get("/v1/quotes", headers=auth).json()
    titles = [q["title"] for q in (quotes["quotes"] if isinstance(quotes, dict) else quotes)]
    assert titles == ["round trip"]


def test_db_restore_of_a_missing_file_exits_2(tmp_path: Path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert main(["db", "restore", str(tmp_path / "nope.bak"), "--database-url", url]) == 2
    assert "db restore" in capsys.readouterr().err
