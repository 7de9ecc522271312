"""HTML pages: form, result (fit table + SVG chart), quote save/approve with CSRF, memtests."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_support import (
    APPROVER_TOKEN,
    REQUESTER_TOKEN,
    SEED_TARGETS,
    approver_headers,
    memtest_bytes,
    memtest_doc,
    upload_headers,
)


def csrf(client: TestClient, path: str = "/") -> str:
    page = client.get(path)
    assert page.status_code == 200
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, "form has no CSRF token"
    assert client.cookies.get("trainfit_csrf") == match.group(1)
    return match.group(1)


def seed_form(**changes: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "model_source": "preset",
        "preset": "qwen3.5-27b",
        "method": "lora",
        "lora_rank": "16",
        "lora_targets": ",".join(SEED_TARGETS),
        "optimizer": "adamw-8bit",
        "precision": "mixed",
        "checkpointing": ["offload", "gpu"],
        "loss": ["chunked", "full"],
        "batch": "1",
        "seq_lens": "16000,32000,48000",
        "gpus": ["a100-80gb", "rtx-pro-6000", "h200"],
        "gpus_extra": "2xh200",
        "usable_fraction": "0.92",
        "profile": "seed-000",
    }
    form.update(changes)
    return form


def test_form_lists_presets_gpus_and_profiles(sqlite_client: TestClient) -> None:
    page = sqlite_client.get("/")
    assert page.status_code == 200
    assert 'value="qwen3.5-27b"' in page.text
    assert 'value="rtx-pro-6000"' in page.text
    assert "seed-000" in page.text
    assert "GiB (2<sup>30</sup> bytes)" in page.text
    cookie = page.headers["set-cookie"]
    assert "trainfit_csrf=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie


def test_result_shows_the_seed_fit_table_and_chart(sqlite_client: TestClient) -> None:
    page = sqlite_client.post("/estimate", data=seed_form())
    assert page.status_code == 200, page.text[:2000]
    table = page.text[page.text.index('id="fit-table"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    assert len(rows) == 1 + 12  # header + 3 lengths x 2 checkpointing x 2 losses
    last = re.findall(r'class="verdict (\w+)"', rows[-1])  # 48k, on the GPU, full logits
    assert last == ["no", "no", "no", "fits"]
    gpu_chunked_48k = re.findall(r'class="verdict (\w+)"', rows[-2])
    assert gpu_chunked_48k[1] == "tight"  # RTX PRO 6000, as in the seed
    assert "<svg" in page.text and "ref-line" in page.text
    assert "a100-80gb usable" in page.text and "a100-80gb capacity" in page.text
    # one bar per option, labelled with the peak the table prints (same order: seq, option)
    table_peaks = [re.findall(r'<td class="num peak">([\d.,]+)</td>', r)[0] for r in rows[1:]]
    chart = page.text[page.text.index('id="memory-chart"') :]
    bar_values = re.findall(
        r'<g class="bar option">.*?class="bar-value">([\d.,]+) GiB<', chart, re.S
    )
    assert bar_values == table_peaks
    assert len(re.findall(r'<g class="bar option per-card">', chart)) == 12  # 2xh200 per card
    assert 'name="request_json"' in page.text


def test_model_name_is_escaped(sqlite_client: TestClient) -> None:
    config = (
        '{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,'
        ' "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,'
        ' "vocab_size": 1000, "max_position_embeddings": 4096}'
    )
    form = seed_form(
        model_source="config",
        config_text=config,
        model_name="<script>alert(1)</script>",
        lora_targets="all-linear",
        seq_lens="1024",
        checkpointing="gpu",
        loss="full",
    )
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:3000]
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


def test_bad_form_input_re_renders_the_form_with_the_field(sqlite_client: TestClient) -> None:
    page = sqlite_client.post("/estimate", data=seed_form(seq_lens="lots", gpus=[], gpus_extra=""))
    assert page.status_code == 422
    # every error at once, each next to its field, which is marked invalid
    assert "2 fields to fix" in page.text
    for name in ("seq_lens", "gpus"):
        assert re.search(
            rf'id="{name}"[^>]*aria-invalid="true" aria-describedby="{name}-error"', page.text
        ), name
        assert f'<span class="field-error" id="{name}-error">' in page.text
    assert 'value="lots"' in page.text  # what was typed is kept
    page = sqlite_client.post("/estimate", data=seed_form(preset="no-such-model"))
    assert page.status_code == 422
    assert "unknown preset" in page.text and 'id="preset-error"' in page.text
    page = sqlite_client.post("/estimate", data=seed_form(lora_rank="0", batch="0"))
    assert page.status_code == 422
    assert 'id="lora_rank-error"' in page.text and 'id="batch-error"' in page.text
    assert "Value error" not in page.text


def test_uploads_are_kept_across_an_error(sqlite_client: TestClient) -> None:
    lengths = b"length\n1000\n2000\n"
    config = b'{"model_type": "llama", "hidden_size": 64}'
    page = sqlite_client.post(
        "/estimate",
        data=seed_form(seq_lens="lots"),
        files={
            "lengths_file": ("lengths.csv", lengths, "text/csv"),
            "config_file": ("tiny.json", config, "application/json"),
        },
    )
    assert page.status_code == 422
    assert "Kept from your upload: <code>lengths.csv</code>" in page.text
    assert "length\n1000\n2000" in page.text  # the lengths, in their text field
    assert 'value="config" id="source-config" checked' in page.text  # the file chose the source
    assert "&#34;model_type&#34;: &#34;llama&#34;" in page.text


def test_dataset_lengths_file_gives_tokens(sqlite_client: TestClient) -> None:
    lengths = "\n".join(str(n) for n in (1000, 2000, 30000, 40000)).encode()
    page = sqlite_client.post(
        "/estimate",
        data=seed_form(checkpointing="offload", loss="chunked"),
        files={"lengths_file": ("lengths.txt", lengths, "text/plain")},
    )
    assert page.status_code == 200, page.text[:2000]
    assert "4 samples, 73,000 tokens" in page.text


def test_seed_lengths_csv_flows_to_the_verdict_and_recommendation(
    sqlite_client: TestClient,
) -> None:
    """Seed 000's own lengths file (a CSV with a header): 40 of 52 samples are dropped at
    16,000 tokens; the recommendation aims at the longest sample (58,700)."""
    from pathlib import Path

    csv = (Path(__file__).resolve().parents[1] / "data/lengths/seed000_lengths.csv").read_bytes()
    page = sqlite_client.post(
        "/estimate",
        data=seed_form(checkpointing="gpu", loss="chunked", epochs="2"),
        files={"lengths_file": ("seed000_lengths.csv", csv, "text/csv")},
    )
    assert page.status_code == 200, page.text[:3000]
    assert "52 samples, 1,324,460 tokens" in page.text
    assert "At 16,000 tokens 40 of 52 samples are dropped." in page.text
    table = page.text[page.text.index('id="fit-table"') :]
    assert '<td class="num dropped warn">40 of 52</td>' in table
    assert '<td class="num dropped warn">15 of 52</td>' in table
    assert "at 58,700 tokens (the longest sample)" in page.text


def _save_quote(client: TestClient) -> str:
    token = csrf(client)
    page = client.post("/estimate", data=seed_form(checkpointing="offload", loss="chunked"))
    bodies = re.findall(r'name="request_json" value="([^"]+)"', page.text)
    import html

    response = client.post(
        "/quotes",
        data={
            "csrf_token": token,
            "variant": "0",
            "request_json": html.unescape(bodies[0]),
            "title": "seed run",
            "token": REQUESTER_TOKEN,
        },
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    location = response.headers["location"]
    assert re.fullmatch(r"/quotes/[0-9a-f]{16}", location)
    return location.rsplit("/", 1)[1]


def test_save_quote_and_approve_it_with_the_token(sqlite_client: TestClient) -> None:
    quote_id = _save_quote(sqlite_client)
    page = sqlite_client.get(f"/quotes/{quote_id}")
    assert 'id="quote-status">pending' in page.text
    shown = re.search(r'name="content_hash" value="([0-9a-f]{64})"', page.text)
    assert shown, "the decision form carries the content hash the page shows"
    content_hash = shown.group(1)
    assert f'id="content-hash">{content_hash}<' in page.text
    token = csrf(sqlite_client, f"/quotes/{quote_id}")
    wrong = sqlite_client.post(
        f"/quotes/{quote_id}/decision",
        data={"csrf_token": token, "decision": "approve", "token": "not-it-at-all"},
    )
    assert wrong.status_code == 403
    assert "not an approver token" in wrong.text
    done = sqlite_client.post(
        f"/quotes/{quote_id}/decision",
        data={
            "csrf_token": token,
            "decision": "approve",
            "token": APPROVER_TOKEN,
            "comment": "go <b>now</b>",
            "content_hash": content_hash,
        },
    )
    assert done.status_code == 200
    assert 'id="quote-status">approved' in done.text
    assert "go &lt;b&gt;now&lt;/b&gt;" in done.text
    api = sqlite_client.get(f"/v1/quotes/{quote_id}").json()
    assert [(a["to_status"], a["outcome"]) for a in api["audit"]] == [
        ("pending", "ok"),
        ("approved", "denied"),
        ("approved", "ok"),
    ]
    assert api["approver"] == "kral" and api["created_by"] == "alice"


def test_quote_form_needs_a_requester_token(sqlite_client: TestClient) -> None:
    token = csrf(sqlite_client)
    page = sqlite_client.post("/estimate", data=seed_form(checkpointing="offload", loss="chunked"))
    body = re.findall(r'name="request_json" value="([^"]+)"', page.text)[0]
    import html

    form = {"csrf_token": token, "variant": "0", "request_json": html.unescape(body)}
    for extra in ({}, {"token": "not-a-token-at-all"}, {"created_by": "kral"}):
        refused = sqlite_client.post("/quotes", data={**form, **extra}, follow_redirects=False)
        assert refused.status_code == 403, extra
    assert sqlite_client.get("/v1/quotes", headers=approver_headers()).json() == []


def test_quote_page_decision_with_a_stale_hash_is_409(sqlite_client: TestClient) -> None:
    quote_id = _save_quote(sqlite_client)
    token = csrf(sqlite_client, f"/quotes/{quote_id}")
    form = {"csrf_token": token, "decision": "approve", "token": APPROVER_TOKEN}
    stale = sqlite_client.post(
        f"/quotes/{quote_id}/decision", data={**form, "content_hash": "0" * 64}
    )
    assert stale.status_code == 409
    assert "changed since you saw it" in stale.text
    repriced = sqlite_client.post(
        f"/quotes/{quote_id}/decision",
        data={"csrf_token": token, "decision": "reprice", "token": REQUESTER_TOKEN},
    )
    assert repriced.status_code == 200 and "Quote repriced." in repriced.text
    assert sqlite_client.get(f"/v1/quotes/{quote_id}").json()["version"] == 2


def test_quote_list_page_needs_a_token(sqlite_client: TestClient) -> None:
    quote_id = _save_quote(sqlite_client)
    assert quote_id not in sqlite_client.get("/quotes").text
    token = csrf(sqlite_client, "/quotes")
    mine = sqlite_client.post("/quotes/list", data={"csrf_token": token, "token": REQUESTER_TOKEN})
    assert mine.status_code == 200 and quote_id in mine.text
    wrong = sqlite_client.post("/quotes/list", data={"csrf_token": token, "token": "nope-nope"})
    assert wrong.status_code == 403 and quote_id not in wrong.text
    no_csrf = sqlite_client.post("/quotes/list", data={"token": REQUESTER_TOKEN})
    assert no_csrf.status_code == 403


def test_quote_post_without_matching_csrf_cookie_is_refused(sqlite_client: TestClient) -> None:
    token = csrf(sqlite_client)
    sqlite_client.cookies.clear()
    response = sqlite_client.post(
        "/quotes", data={"csrf_token": token, "request_json": "{}"}, follow_redirects=False
    )
    assert response.status_code == 403


def test_unknown_pages_are_404(sqlite_client: TestClient) -> None:
    assert sqlite_client.get("/quotes/nope").status_code == 404
    assert sqlite_client.get("/memtests/nope").status_code == 404


def test_memtest_page_shows_measured_vs_estimated(
    sqlite_client: TestClient, fake_library: None
) -> None:
    created = sqlite_client.post(
        "/v1/memtests", content=memtest_bytes(), headers=upload_headers()
    ).json()
    page = sqlite_client.get(f"/memtests/{created['id']}")
    assert page.status_code == 200, page.text[:2000]
    assert 'id="comparison"' in page.text and "<svg" in page.text
    assert "57.7" in page.text  # 62e9 bytes measured at 16k, in GiB
    listing = sqlite_client.get("/memtests")
    assert created["id"] in listing.text


def test_comparison_endpoint(sqlite_client: TestClient, fake_library: None) -> None:
    created = sqlite_client.post(
        "/v1/memtests", content=memtest_bytes(), headers=upload_headers()
    ).json()
    body = sqlite_client.get(f"/v1/memtests/{created['id']}/comparison").json()
    assert [r["seq_len"] for r in body["rows"]] == [16000, 32000, 48000]
    assert body["rows"][2]["status"] == "oom"


def test_comparison_with_the_real_estimator(sqlite_client: TestClient) -> None:
    pytest.importorskip("estimator.compare", reason="estimator.compare not written yet")
    from estimator.presets import preset_config

    model = dict(memtest_doc()["model"], config=preset_config("qwen3.5-27b"))
    created = sqlite_client.post(
        "/v1/memtests", content=memtest_bytes(model=model), headers=upload_headers()
    ).json()
    response = sqlite_client.get(f"/v1/memtests/{created['id']}/comparison")
    assert response.status_code == 200, response.text
    rows = response.json()["rows"]
    assert rows[0]["measured_peak_bytes"] == 62_000_000_000
    assert rows[0]["estimated_peak_bytes"] > 0
    page = sqlite_client.get(f"/memtests/{created['id']}?profile=seed-000")
    assert page.status_code == 200


def test_form_takes_a_pipeline_schedule_and_names_its_errors(sqlite_client: TestClient) -> None:
    form = seed_form(
        parallel="fsdp,pp=2", pp_schedule="interleaved-1f1b", gpus=[], gpus_extra="8xh100"
    )
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:3000]
    page = sqlite_client.post("/estimate", data=seed_form(parallel="fsdp", pp_schedule="gpipe"))
    assert page.status_code == 422
    assert 'id="pp_schedule-error"' in page.text
    page = sqlite_client.post("/estimate", data=seed_form(parallel="fsdp,pp=2", pp_virtual="x"))
    assert page.status_code == 422
    assert 'id="pp_virtual-error"' in page.text


def llama_form(**changes: Any) -> dict[str, Any]:
    """Llama-3.1-8B LoRA on every Linear, full loss, on one H100, the default profile."""
    base = {
        "preset": "llama-3.1-8b",
        "lora_targets": "all-linear",
        "optimizer": "adamw",
        "checkpointing": "gpu",
        "loss": "full",
        "gpus": ["h100-80gb"],
        "gpus_extra": "",
        "profile": "default",
    }
    return seed_form(**{**base, **changes})


def test_the_result_names_what_peft_default_resolved_to(sqlite_client: TestClient) -> None:
    page = sqlite_client.get("/")
    assert "peft-default" in page.text  # the form says the word exists
    form = llama_form(lora_targets="peft-default", seq_lens="4096")
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:2000]
    notes = page.text[page.text.index('id="model-notes"') :]
    assert "q_proj, v_proj" in notes[: notes.index("</ul>")]
    q_and_v = 32 * 16 * ((4096 + 4096) + (4096 + 1024))  # 32 layers, rank 16, GQA's v_proj
    assert f"{q_and_v:,} trainable" in page.text


def test_the_form_prices_an_evaluation_pass(sqlite_client: TestClient) -> None:
    assert 'id="eval_batch_hint"' in sqlite_client.get("/").text
    form = llama_form(seq_lens="8192", eval_batch="4")
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:2000]
    assert "evaluation batch 4" in page.text
    assert "(peak: evaluation pass)" in page.text
    bad = sqlite_client.post("/estimate", data={**form, "eval_batch": "lots"})
    assert bad.status_code == 422
    assert 'id="eval_batch-error"' in bad.text and 'value="lots"' in bad.text
    zero = sqlite_client.post("/estimate", data={**form, "eval_batch": "0"})
    assert zero.status_code == 422 and 'id="eval_batch-error"' in zero.text


def test_the_form_s_liger_rows_can_skip_the_evaluation_logits(sqlite_client: TestClient) -> None:
    """The box sets `eval_skip_logits` on the Liger rows of a comparison only (the other losses
    would refuse it), so one form compares both: the Liger row's evaluation pass loses its
    logits, the full loss's keeps them."""
    assert 'id="eval_skip_logits"' in sqlite_client.get("/").text
    form = llama_form(seq_lens="4096", eval_batch="16", loss=["liger", "full"])
    pages = {}
    for box in ("", "on"):
        page = sqlite_client.post("/estimate", data={**form, "eval_skip_logits": box})
        assert page.status_code == 200, page.text[:2000]
        pages[box] = page.text
    assert pages[""] != pages["on"]
    assert "eval_skip_logits=on" in pages["on"]  # the page's link re-renders the same estimate
    peaks = []
    for box in ("", "on"):
        liger_only = {**form, "loss": ["liger"], "eval_skip_logits": box}
        page = sqlite_client.post("/estimate", data=liger_only)
        found = re.search(r"liger \(peak: evaluation pass\): ([\d.]+) GiB", page.text)
        assert page.status_code == 200 and found, page.text[:2000]
        peaks.append(float(found.group(1)))
    assert peaks[1] < peaks[0] - 16 * 4096 * 128_256 * 2 / 2**30  # less the bf16 logits at least


def test_the_form_s_precision_defaults_to_the_stack_s(sqlite_client: TestClient) -> None:
    """Blank precision ("stack default", the form's default): a full fine-tune on the unsloth
    stack is priced in bf16, Unsloth's own (tests/estimator/test_stack_full_precision.py);
    a chosen precision wins."""
    page = sqlite_client.get("/")
    assert '<option value="" selected>stack default</option>' in page.text
    form = seed_form(
        preset="llama-3.1-8b",
        lora_targets="all-linear",
        stack="unsloth",
        method="full",
        precision="",
        seq_lens="2048",
        gpus=["h200"],
        gpus_extra="",
        profile="default",
    )
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:2000]
    assert "precision bf16" in page.text
    page = sqlite_client.post("/estimate", data={**form, "precision": "mixed"})
    assert page.status_code == 200 and "precision mixed" in page.text


def test_the_form_prices_a_dpo_run_and_names_a_setup_it_cannot(sqlite_client: TestClient) -> None:
    form = seed_form(
        objective="dpo", profile="default", loss=["chunked"], gpus=["h200"], gpus_extra=""
    )
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:2000]
    assert "DPO (a reference forward each step)" in page.text
    assert "batch 1 preference pairs (padded rows)" in page.text
    # TRL 1.0-1.9's DPOTrainer (axolotl's pin): the full logits, priced above the fused head
    full = sqlite_client.post("/estimate", data={**form, "loss": ["full"]})
    assert full.status_code == 200, full.text[:2000]
    assert "DPO (a reference forward each step)" in full.text
    edit = sqlite_client.get("/?objective=dpo")  # "Edit these inputs" keeps the objective
    assert "<option selected>dpo</option>" in edit.text
    page = sqlite_client.post("/estimate", data={**form, "stack": "unsloth"})
    assert page.status_code == 422
    assert 'id="objective-error"' in page.text and "DPOTrainer" in page.text


def test_the_form_prices_an_orpo_run_and_names_the_loss_it_needs(
    sqlite_client: TestClient,
) -> None:
    """TRL 1.0-1.9's ORPOTrainer reads the full logits: priced with loss full, and the form's
    default chunked loss is a 422 naming the loss."""
    form = seed_form(
        objective="orpo", profile="default", loss=["full"], gpus=["h200"], gpus_extra=""
    )
    page = sqlite_client.post("/estimate", data=form)
    assert page.status_code == 200, page.text[:2000]
    assert "ORPO (TRL&#39;s ORPOTrainer, no reference)" in page.text
    assert "batch 1 preference pairs (padded rows)" in page.text
    chunked = sqlite_client.post("/estimate", data={**form, "loss": ["chunked"]})
    assert chunked.status_code == 422
    assert 'id="loss-error"' in chunked.text and "ORPOTrainer" in chunked.text
