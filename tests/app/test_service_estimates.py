"""`POST /v1/estimate` and `POST /v1/check` with the real estimator on the seed-000 cases."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import SEED_TARGETS


def seed_body(checkpointing: str, loss: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"preset": "qwen3.5-27b"},
        "setup": {
            "method": "lora",
            "lora_rank": 16,
            "lora_targets": SEED_TARGETS,
            "optimizer": "adamw-8bit",
            "checkpointing": checkpointing,
            "loss": loss,
            "batch": 1,
        },
        "seq_lens": [48000],
        "profile": "seed-000",
    }
    body.update(changes)
    return body


@pytest.mark.parametrize(
    ("checkpointing", "loss", "gpu", "verdict"),
    [
        ("offload", "chunked", "a100-80gb", "fits"),
        ("gpu", "chunked", "rtx-pro-6000", "tight"),
        ("gpu", "full", "h200", "no"),
    ],
)
def test_check_gives_the_seed_verdicts(
    sqlite_client: TestClient, checkpointing: str, loss: str, gpu: str, verdict: str
) -> None:
    response = sqlite_client.post("/v1/check", json=seed_body(checkpointing, loss, gpu=gpu))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["verdict"] == verdict
    assert body["fits"] is (verdict == "fits")
    assert body["seq_len"] == 48000
    assert body["margin_bytes"] == body["usable_bytes"] - body["peak_bytes"]


def test_estimate_returns_the_document_in_bytes(sqlite_client: TestClient) -> None:
    body = seed_body(
        "offload", "chunked", seq_lens=[16000, 48000], gpus=["a100-80gb", "h200", "2xh200"]
    )
    response = sqlite_client.post("/v1/estimate", json=body)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["model"]["params_trainable"] > 0
    assert [r["seq_len"] for r in doc["rows"]] == [16000, 48000]
    row = doc["rows"][1]
    assert set(row["components"]) >= {
        "weights",
        "trainable_states",
        "checkpoints",
        "recompute_peak",
        "logits",
        "overhead",
    }
    assert all(isinstance(v, int) for v in row["components"].values())
    assert set(row["fit"]) == {"a100-80gb", "h200", "2xh200"}
    assert row["fit"]["a100-80gb"]["verdict"] == "fits"
    assert "assumptions" in doc


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"model": {"preset": "no-such-model"}, "gpus": ["h200"]}, ["body", "model", "preset"]),
        ({"model": {"preset": "gpt2"}, "gpus": ["no-such-gpu"]}, ["body", "gpus", 0]),
        ({"model": {"preset": "gpt2"}, "gpus": ["0xh200"]}, ["body", "gpus", 0]),
        ({"model": {"preset": "gpt2"}, "gpus": ["h200"], "profile": "zzz"}, ["body", "profile"]),
        (
            {"model": {"config": {"model_type": "llama"}}, "gpus": ["h200"]},
            ["body", "model", "config"],
        ),
        ({"model": {"preset": "gpt2"}, "setup": {"method": "magic"}}, ["body", "setup", "method"]),
        ({"model": {"preset": "gpt2"}, "seq_lens": [0]}, ["body"]),
        ({"model": {"preset": "gpt2", "params": 7e9}}, ["body", "model"]),
        ({"model": {"preset": "gpt2"}, "surprise": True}, ["body", "surprise"]),
        ({"model": {"preset": "gpt2"}, "usable_fraction": 0}, ["body", "usable_fraction"]),
    ],
)
def test_bad_estimate_input_is_422_naming_the_field(
    sqlite_client: TestClient, body: dict[str, Any], loc: list[Any]
) -> None:
    response = sqlite_client.post("/v1/estimate", json=body)
    assert response.status_code == 422, response.text
    got = response.json()["detail"][0]["loc"]
    assert got[: len(loc)] == loc


def test_check_bad_input_is_422(sqlite_client: TestClient) -> None:
    assert sqlite_client.post("/v1/check", json={"model": {"preset": "gpt2"}}).status_code == 422
    body = seed_body("gpu", "full", gpu="no-such-gpu")
    response = sqlite_client.post("/v1/check", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][:2] == ["body", "gpu"]


def test_catalog_and_presets(sqlite_client: TestClient) -> None:
    gpus = sqlite_client.get("/v1/gpus").json()
    assert {"a100-80gb", "h200", "rtx-pro-6000"} <= {g["id"] for g in gpus}
    assert all(isinstance(g["capacity_bytes"], int) for g in gpus)
    presets = sqlite_client.get("/v1/models").json()
    assert "qwen3.5-27b" in {p["id"] for p in presets}
    assert "seed-000" in sqlite_client.get("/v1/profiles").json()


def test_healthz_and_openapi(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/healthz").json()["status"] == "ok"
    spec = sqlite_client.get("/openapi.json").json()
    for path in ("/v1/estimate", "/v1/check", "/v1/memtests", "/v1/quotes/{quote_id}/approve"):
        assert path in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert "examples" in schemas["EstimateRequest"]


def test_regex_lora_targets_are_estimated_and_bad_or_hostile_ones_are_422(
    sqlite_client: TestClient,
) -> None:
    def post(targets: list[str]) -> Any:
        body = seed_body("offload", "chunked", gpus=["h200"])
        body["setup"]["lora_targets"] = targets
        return sqlite_client.post("/v1/estimate", json=body)

    pattern = (
        r"re:model\.language_model\.layers\.\d+\."
        r"(self_attn\.(q|k|v|o)_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
        r"|mlp\.(gate|up|down)_proj)"
    )
    by_names, by_regex = post(SEED_TARGETS), post([pattern])
    assert by_regex.status_code == 200, by_regex.text
    trainable = [r.json()["model"]["params_trainable"] for r in (by_names, by_regex)]
    assert trainable[0] == trainable[1] > 0
    for bad, words in (
        ("re:(q_proj", "not a regular expression"),
        ("re:(.*){1,32000}[bc]", "too long"),
    ):
        response = post([bad])
        assert response.status_code == 422, response.text
        detail = response.json()["detail"][0]
        assert "lora_targets" in ".".join(map(str, detail["loc"])) and words in detail["msg"]


def test_the_evaluation_pass_over_rest(sqlite_client: TestClient) -> None:
    """`setup.eval_batch`: echoed, priced as the `evaluation` moment; bad values are 422
    naming it."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "setup": {"method": "lora", "loss": "full", "eval_batch": 4},
        "seq_lens": [8192],
        "gpus": ["h100-80gb"],
    }
    response = sqlite_client.post("/v1/estimate", json=body)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["setup"]["eval_batch"] == 4
    assert doc["rows"][0]["peak_phase"] == "evaluation"
    for setup in ({"eval_batch": 0}, {"eval_batch": "many"}):
        response = sqlite_client.post("/v1/estimate", json={**body, "setup": setup})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"][0]
        assert detail["loc"][:2] == ["body", "setup"]
        assert "eval_batch" in str(detail["loc"]) + detail["msg"]
    skipped = {"method": "lora", "loss": "liger", "eval_batch": 4, "eval_skip_logits": True}
    response = sqlite_client.post("/v1/estimate", json={**body, "setup": skipped})
    assert response.status_code == 200, response.text
    assert response.json()["setup"]["eval_skip_logits"] is True
    peaks = [doc["rows"][0]["peak_bytes"] for doc in (doc, response.json())]
    assert peaks[1] < peaks[0]  # no logits in the pass
    for setup in (
        {"loss": "full", "eval_batch": 4, "eval_skip_logits": True},
        {"loss": "liger", "eval_skip_logits": True},
        {"loss": "liger", "eval_batch": 4, "eval_skip_logits": "yes please"},
    ):
        response = sqlite_client.post("/v1/estimate", json={**body, "setup": setup})
        assert response.status_code == 422, response.text
        detail = response.json()["detail"][0]
        assert "eval_skip_logits" in str(detail["loc"]) + detail["msg"]


def test_padded_batches_over_rest(sqlite_client: TestClient) -> None:
    """`setup.padded_batches`: echoed (false by default), a padded batch's masks priced; a
    value that is not a boolean is 422 naming it."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "setup": {"method": "lora", "batch": 4, "checkpointing": "none"},
        "seq_lens": [4096],
        "gpus": ["h200"],
    }
    plain = sqlite_client.post("/v1/estimate", json=body).json()
    assert plain["setup"]["padded_batches"] is False
    body["setup"] = {**body["setup"], "padded_batches": True}
    padded = sqlite_client.post("/v1/estimate", json=body).json()
    assert padded["setup"]["padded_batches"] is True
    layers = 32  # a bf16 (4, 1, 4096, 4096) copy per layer and one boolean mask
    masks = 4 * 4096 * 4096 * (1 + 2 * layers)
    peak = padded["rows"][0]["fit"]["h200"]["peak_bytes"]
    assert peak - plain["rows"][0]["fit"]["h200"]["peak_bytes"] >= masks
    response = sqlite_client.post(
        "/v1/estimate", json={**body, "setup": {"padded_batches": "sometimes"}}
    )
    assert response.status_code == 422, response.text
    assert "padded_batches" in str(response.json()["detail"][0]["loc"])


def test_a_training_config_s_evaluation_pass_and_its_null_override(
    sqlite_client: TestClient,
) -> None:
    text = (
        "base_model: meta-llama/Llama-3.1-8B\nsequence_len: 4096\nmicro_batch_size: 1\n"
        "adapter: lora\nlora_r: 16\nlora_target_linear: true\nval_set_size: 0.05\n"
        "eval_batch_size: 8\n"
    )
    body: dict[str, Any] = {
        "train_config": {"text": text, "format": "axolotl"},
        "gpus": ["h100-80gb"],
    }
    read = sqlite_client.post("/v1/estimate", json=body)
    assert read.status_code == 200, read.text
    assert read.json()["setup"]["eval_batch"] == 8
    dropped = sqlite_client.post("/v1/estimate", json={**body, "setup": {"eval_batch": None}})
    assert dropped.status_code == 200, dropped.text
    assert dropped.json()["setup"]["eval_batch"] is None
    assert "evaluation" not in dropped.json()["rows"][0]["phases"]


def test_an_unsloth_full_fine_tune_takes_the_stack_s_precision(sqlite_client: TestClient) -> None:
    """`setup.precision` left out: the stack's (unsloth full fine-tuning: bf16, Unsloth's own
    default; tests/estimator/test_stack_full_precision.py); given, it wins."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "setup": {"stack": "unsloth", "method": "full"},
        "gpus": ["h200"],
    }
    response = sqlite_client.post("/v1/estimate", json=body)
    assert response.status_code == 200 and response.json()["setup"]["precision"] == "bf16"
    body["setup"]["precision"] = "mixed"
    response = sqlite_client.post("/v1/estimate", json=body)
    assert response.status_code == 200 and response.json()["setup"]["precision"] == "mixed"
