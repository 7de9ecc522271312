"""`POST /v1/check` and `/v1/estimate` with a training config's text: the same answer as the
CLI's --train-config, fields in the body win, and a bad config is a 422 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from estimator.document import check_document
from estimator.request import CheckRequest
from estimator.train_config import read_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "train_configs"
AXOLOTL = EXAMPLES / "axolotl-qlora-llama31-8b.yml"


def test_check_with_a_train_config_equals_the_mapped_request(sqlite_client: TestClient) -> None:
    res = sqlite_client.post(
        "/v1/check", json={"gpu": "h100-80gb", "train_config": {"text": AXOLOTL.read_text()}}
    )
    assert res.status_code == 200, res.text
    body = res.json()
    mapping = read_file(AXOLOTL)
    assert body["train_config"]["format"] == mapping.format == "axolotl"
    assert (
        {"key", "reason"} <= set(body["train_config"]["ignored"][0])
        if body["train_config"]["ignored"]
        else True
    )
    direct = check_document(
        CheckRequest.model_validate(
            {"gpu": "h100-80gb", "train_config": {"text": AXOLOTL.read_text()}}
        )
    )
    assert body["peak_bytes"] == direct["peak_bytes"]
    assert body["seq_len"] == mapping.seq_lens[-1]


def test_fields_in_the_body_win_over_the_config(sqlite_client: TestClient) -> None:
    text = AXOLOTL.read_text()
    base = sqlite_client.post(
        "/v1/check", json={"gpu": "h100-80gb", "train_config": {"text": text}}
    )
    longer = sqlite_client.post(
        "/v1/check",
        json={"gpu": "h100-80gb", "seq_lens": [32768], "train_config": {"text": text}},
    )
    assert longer.json()["seq_len"] == 32768
    assert longer.json()["peak_bytes"] > base.json()["peak_bytes"]


def test_estimate_reports_what_the_config_set_and_ignored(sqlite_client: TestClient) -> None:
    res = sqlite_client.post(
        "/v1/estimate", json={"gpus": ["h200"], "train_config": {"text": AXOLOTL.read_text()}}
    )
    assert res.status_code == 200, res.text
    doc = res.json()
    assert doc["setup"]["method"] == "qlora"
    assert doc["setup"]["ignored"] == doc["train_config"]["ignored"]


def test_a_config_that_is_not_one_is_a_422_naming_the_field(sqlite_client: TestClient) -> None:
    res = sqlite_client.post(
        "/v1/check", json={"gpu": "h100-80gb", "train_config": {"text": "just: words\n"}}
    )
    assert res.status_code == 422
    assert "train_config" in res.text and "Value error" not in res.text
    res = sqlite_client.post(
        "/v1/check", json={"gpu": "h100-80gb", "train_config": {"text": "x", "colour": "red"}}
    )
    assert res.status_code == 422 and "train_config.colour" in res.text


def test_a_config_sent_as_text_makes_the_service_open_no_file(
    sqlite_client: TestClient, tmp_path: Path
) -> None:
    secret = tmp_path / "ds.json"
    secret.write_text('{"zero_optimization": {"stage": 3}}')
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    text = f"base_model: {local}\nadapter: lora\ndeepspeed: {secret}\n"
    res = sqlite_client.post(
        "/v1/check", json={"gpu": "h100-80gb", "model": {"preset": "llama-3.1-8b"},
                           "seq_lens": [1024], "train_config": {"text": text}},
    )  # fmt: skip
    assert res.status_code == 200, res.text
    report = res.json()["train_config"]
    assert "sharding" not in report["setup"]  # ds.json was not read
    reasons = {i["key"]: i["reason"] for i in report["ignored"]}
    assert "is not read from a config sent as text" in reasons["deepspeed"]
    assert report["model"] == {"preset": str(local)}  # a name, not a file that was looked at


def test_a_peft_adapter_config_fills_the_request(sqlite_client: TestClient) -> None:
    adapter = {
        "peft_type": "LORA",
        "r": 32,
        "lora_alpha": 16,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "meta-llama/Llama-3.1-8B",
    }
    for fmt in ("peft", None):  # given, or detected from `peft_type`
        config = {"text": json.dumps(adapter), **({"format": fmt} if fmt else {})}
        res = sqlite_client.post(
            "/v1/estimate",
            json={"gpus": ["h200"], "setup": {"lora_rank": 8}, "train_config": config},
        )
        assert res.status_code == 200, res.text
        doc = res.json()
        assert doc["train_config"]["format"] == "peft"
        assert doc["model"]["name"] == "llama-3.1-8b"
        setup = doc["setup"]
        assert (setup["method"], setup["lora_dropout"]) == ("lora", 0.05)
        assert setup["lora_rank"] == 8  # the body's field wins
        assert setup["lora_targets"] == ["q_proj", "v_proj"]
    other = {"text": json.dumps({**adapter, "peft_type": "ADALORA"})}
    res = sqlite_client.post("/v1/estimate", json={"gpus": ["h200"], "train_config": other})
    assert res.status_code == 422 and "train_config.peft_type" in res.text


def test_a_llamafactory_v1_config_is_read_as_its_loop_runs(sqlite_client: TestClient) -> None:
    text = (
        "model: meta-llama/Llama-3.1-8B\npeft_config:\n  name: lora\n  r: 16\n"
        "micro_batch_size: 2\ncutoff_len: 4096\n"
    )
    for fmt in ("llamafactory", None):  # given, or detected from `model:` + v1 keys
        config = {"text": text, **({"format": fmt} if fmt else {})}
        res = sqlite_client.post("/v1/estimate", json={"gpus": ["h200"], "train_config": config})
        assert res.status_code == 200, res.text
        doc = res.json()
        assert doc["train_config"]["format"] == "llamafactory-v1"
        setup = doc["setup"]
        assert (setup["method"], setup["lora_rank"], setup["lora_dropout"]) == ("lora", 16, 0.05)
        assert (setup["batch"], setup["autocast"]) == (2, False)
        assert [row["seq_len"] for row in doc["rows"]] == [4096]
    bad = {"text": text.replace("r: 16", "r: sixteen")}
    res = sqlite_client.post("/v1/estimate", json={"gpus": ["h200"], "train_config": bad})
    assert res.status_code == 422 and "train_config.peft_config.r" in res.text


def test_quantized_expert_banks_over_rest(sqlite_client: TestClient) -> None:
    """`setup.quantize_experts` and axolotl's `quantize_moe_experts` (estimator side:
    tests/estimator/test_quantize_experts.py); a base that cannot store NF4 banks is a 422."""
    body: dict[str, object] = {
        "model": {"preset": "qwen3-30b-a3b"},
        "setup": {"method": "lora", "quantize_experts": True},
        "gpus": ["h200"],
    }
    res = sqlite_client.post("/v1/estimate", json=body)
    assert res.status_code == 422 and "quantize_experts" in res.text
    text = "base_model: Qwen/Qwen3-30B-A3B\nadapter: qlora\nload_in_4bit: true\n"
    for config, expected in ((text, False), (text + "quantize_moe_experts: true\n", True)):
        body = {
            "model": {"preset": "qwen3-30b-a3b"},
            "gpus": ["h200"],
            "train_config": {"text": config},
        }
        res = sqlite_client.post("/v1/estimate", json=body)
        assert res.status_code == 200, res.text
        assert res.json()["setup"]["quantize_experts"] is expected
