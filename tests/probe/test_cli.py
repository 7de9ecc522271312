"""The `trainfit-probe` command line: exit codes, messages, output file, upload."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

pytest.importorskip("torch")

from memtest_schema import load_memtest  # noqa: E402
from probe.cli import main  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "data" / "configs" / "tiny-llama.json"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _bad(capsys, *argv: str) -> str:
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err
    return err


def test_missing_config_file_exits_2_naming_config(capsys, tmp_path):
    err = _bad(capsys, "--config", str(tmp_path / "nope.json"), "--device", "cpu")
    assert "config: no such file" in err


def test_malformed_config_json_exits_2(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", ')
    err = _bad(capsys, "--config", str(path), "--device", "cpu")
    assert "config:" in err and "not valid JSON" in err


def test_unknown_model_type_exits_2_naming_model_type(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(TINY.read_text()), "model_type": "llamazing"}))
    err = _bad(capsys, "--config", str(path), "--device", "cpu")
    assert "config.model_type" in err and "llamazing" in err


def test_negative_size_in_config_exits_2_naming_the_field(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(TINY.read_text()), "hidden_size": -64}))
    err = _bad(capsys, "--config", str(path), "--device", "cpu")
    assert "config.hidden_size" in err


def test_config_that_cannot_be_built_exits_2(capsys, tmp_path):
    path = tmp_path / "config.json"
    # 64 hidden cannot be split into 5 heads
    path.write_text(json.dumps({**json.loads(TINY.read_text()), "num_attention_heads": 5}))
    code, _, err = _run(capsys, "--config", str(path), "--device", "cpu", "--sweep", "16")
    assert code == 2 and "Traceback" not in err and "config" in err


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--sweep", "64,-5"], "sweep[1]"),
        (["--sweep", "64,abc"], "sweep[1]"),
        (["--steps", "0"], "steps"),
        (["--batch", "0"], "setup.batch"),
        (["--lora-rank", "-1"], "setup.lora_rank"),
        (["--optimizer", "adam"], "--optimizer"),
        (["--memory-cap", "-3"], "memory_cap"),
        (["--lora-targets", ","], "setup.lora_targets"),
    ],
)
def test_bad_options_exit_2_naming_the_field(capsys, args, field):
    err = _bad(capsys, "--config", str(TINY), "--device", "cpu", *args)
    assert field in err


def test_missing_required_config_option_exits_2(capsys):
    err = _bad(capsys, "--device", "cpu")
    assert "--config" in err


def test_a_cpu_run_writes_a_valid_memtest_and_prints_a_summary(capsys, tmp_path):
    out = tmp_path / "m.json"
    code, stdout, _ = _run(
        capsys,
        "--config",
        str(TINY),
        "--device",
        "cpu",
        "--sweep",
        "32,64",
        "--steps",
        "1",
        "--out",
        str(out),
        "--no-progress",
    )
    assert code == 0
    doc = load_memtest(out.read_bytes())
    assert doc["model"]["name"] == "tiny-llama"
    assert doc["tool"]["command"].startswith("trainfit-probe --config")
    assert "wrote" in stdout and "seq_len" in stdout


def test_default_output_name_has_model_device_and_date(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, _ = _run(
        capsys,
        "--config",
        str(TINY),
        "--device",
        "cpu",
        "--sweep",
        "16",
        "--steps",
        "1",
        "--no-progress",
    )
    assert code == 0
    (written,) = tmp_path.glob("memtest_tiny-llama_cpu_*.json")
    load_memtest(written.read_text())


class _Server(BaseHTTPRequestHandler):
    received: list[tuple[str, str | None, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Server.received.append((self.path, self.headers.get("Authorization"), body))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"id": "mt-1"}')

    def log_message(self, *args: object) -> None:
        pass


def test_upload_posts_the_memtest_with_the_bearer_token(capsys, tmp_path, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("TRAINFIT_TOKEN", "secret-token")
    url = f"http://127.0.0.1:{server.server_port}/v1/memtests"
    try:
        code, stdout, err = _run(
            capsys,
            "--config",
            str(TINY),
            "--device",
            "cpu",
            "--sweep",
            "16",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "m.json"),
            "--upload",
            url,
            "--no-progress",
        )
    finally:
        server.shutdown()
    assert code == 0, err
    path, auth, body = _Server.received[-1]
    assert path == "/v1/memtests"
    assert auth == "Bearer secret-token"
    assert load_memtest(body)["sweep"] == [16]
    assert "uploaded as mt-1" in stdout


def test_upload_to_an_unreachable_server_exits_1(capsys, tmp_path):
    code, _, err = _run(
        capsys,
        "--config",
        str(TINY),
        "--device",
        "cpu",
        "--sweep",
        "16",
        "--steps",
        "1",
        "--out",
        str(tmp_path / "m.json"),
        "--upload",
        "http://127.0.0.1:9/v1/memtests",
        "--no-progress",
    )
    assert code == 1 and "upload" in err


def test_tokens_per_second_leaves_out_the_warm_up_step():
    from probe.results import tokens_per_second

    assert tokens_per_second([9.0, 1.0, 3.0], 100) == 50.0  # mean of the timed steps: 2 s
    assert tokens_per_second([4.0], 100) == 25.0  # one step: it is all there is
    assert tokens_per_second([], 100) is None
    assert tokens_per_second([1.0, 0.0], 100) is None


def _tiny_cpu_run(capsys, out: Path, *options: str) -> tuple[int, str, str]:
    """The tiny config on the CPU, no progress bar, written to `out`."""
    base = ("--config", str(TINY), "--device", "cpu", "--no-progress", "--out", str(out))
    return _run(capsys, *base, *options)


def test_timings_prints_each_phase_with_seconds_on_stderr(capsys, tmp_path):
    code, _, err = _tiny_cpu_run(
        capsys, tmp_path / "m.json", "--sweep", "32,64", "--steps", "1", "--timings"
    )
    assert code == 0
    phases = [line for line in err.splitlines() if line.startswith("trainfit-probe: [")]
    assert [p.split("] ", 1)[1] for p in phases] == [
        "built the model (probe stack, cpu)",
        "seq_len 32: started",
        phases[2].split("] ", 1)[1],
        "seq_len 64: started",
        phases[4].split("] ", 1)[1],
    ]
    assert phases[2].split("] ", 1)[1].startswith("seq_len 32: ok, steps [")
    seconds = [float(p.split("[", 1)[1].split(" s]", 1)[0]) for p in phases]
    assert seconds == sorted(seconds)


def test_simulate_reserved_adds_each_lengths_replayed_reserved_peak(capsys, tmp_path):
    out = tmp_path / "m.json"
    code, stdout, _ = _tiny_cpu_run(
        capsys, out, "--sweep", "32,64", "--steps", "2", "--simulate-reserved"
    )
    assert code == 0
    doc = load_memtest(out.read_bytes())
    for r in doc["results"]:
        assert r["status"] == "ok" and r["peak_reserved_bytes"] is None  # nothing measured
        # the caching allocator rounds every block up (512 B, 2 MiB segments): never below
        assert r["simulated_reserved_bytes"] >= r["peak_allocated_bytes"]
        assert r["simulated_reserved_bytes"] % (2 * 2**20) == 0  # whole small-pool segments
    assert any("simulated_reserved_bytes" in note for note in doc["notes"])
    assert "sim. reserved GiB" in stdout.splitlines()[0]


@pytest.mark.parametrize(
    "args",
    [("--device", "cuda"), ("--device", "cpu", "--stack", "torchtitan")],
    ids=["cuda-measures-it", "torchtitan"],
)
def test_simulate_reserved_where_it_cannot_apply_exits_2_naming_it(capsys, args):
    code, _, err = _run(
        capsys, "--config", str(TINY), "--sweep", "32", "--simulate-reserved", *args
    )
    assert code == 2
    assert "simulate_reserved" in err


def test_compare_puts_the_estimate_reserved_next_to_the_simulated_one(capsys, tmp_path):
    from estimator.document import compare_memtest

    out = tmp_path / "m.json"
    _tiny_cpu_run(capsys, out, "--sweep", "64", "--steps", "2", "--simulate-reserved")
    doc = json.loads(out.read_text())
    row = compare_memtest(doc)["rows"][0]
    simulated = doc["results"][0]["simulated_reserved_bytes"]
    assert row["simulated_reserved_bytes"] == simulated
    expected = 100 * (row["estimated_reserved_bytes"] - simulated) / simulated
    assert row["simulated_reserved_error_pct"] == pytest.approx(expected, abs=0.01)
    assert row["measured_reserved_bytes"] is None and row["reserved_error_pct"] is None
