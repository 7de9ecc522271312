"""The web flows of issue 13 without a browser: links that re-render an estimate, Markdown /
CSV copies, quotes for a chosen option with a typed price, drafts, the status filter, the page
without an approver, memtest uploads in the form, the per-component comparison, offline docs,
Hub ids and training configs on the form."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from fastapi.testclient import TestClient
from service_support import (
    APPROVER_TOKEN,
    REQUESTER_TOKEN,
    UPLOAD_TOKEN,
    make_settings,
    seed_case_memtest,
)
from test_service_pages import csrf, seed_form

from app.factory import create_app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "train_configs"


def _fit_table(text: str) -> str:
    table = text[text.index('id="fit-table"') :]
    return table[: table.index("</table>")]


def _href(text: str, element_id: str) -> str:
    found = re.search(rf'<a href="([^"]+)"[^>]*id="{element_id}"', text)
    assert found, element_id
    return html.unescape(found.group(1))


def test_the_link_re_renders_the_same_estimate(sqlite_client: TestClient) -> None:
    posted = sqlite_client.post("/estimate", data=seed_form(tokens="6400000"))
    assert posted.status_code == 200, posted.text[:2000]
    link = _href(posted.text, "permalink")
    assert link.startswith("/estimate?")
    again = sqlite_client.get(link)
    assert again.status_code == 200
    assert _fit_table(again.text) == _fit_table(posted.text)
    assert _href(again.text, "permalink") == link  # a link of a link is the same link
    edit = sqlite_client.get(_href(posted.text, "edit-inputs"))
    assert 'value="16000,32000,48000"' in edit.text
    assert re.search(r"<option selected>seed-000</option>", edit.text)
    assert re.search(r'id="ckpt-offload" checked', edit.text)
    query = parse_qs(link.split("?", 1)[1])
    assert query["gpus"] == ["a100-80gb", "rtx-pro-6000", "h200"] and query["tokens"] == ["6400000"]


def test_copy_as_markdown_and_csv_is_what_the_cli_prints(sqlite_client: TestClient) -> None:
    posted = sqlite_client.post("/estimate", data=seed_form())
    markdown = sqlite_client.get(_href(posted.text, "copy-md"))
    assert markdown.status_code == 200 and markdown.headers["content-type"].startswith(
        "text/markdown"
    )
    # the README's seed table rows (trainfit estimate ... --profile seed-000 --format markdown)
    assert "| 48000 | 1 | on the GPU | chunked | 94.3 | no | tight | fits | fits (53.3/card) |" in (
        markdown.text
    )
    csv = sqlite_client.get(_href(posted.text, "copy-csv"))
    assert csv.status_code == 200 and csv.text.splitlines()[0].startswith("seq")
    bad = sqlite_client.get("/estimate.md?seq_lens=lots&preset=qwen3.5-27b")
    assert bad.status_code == 422 and "seq_lens" in bad.text


def _post_and_save(client: TestClient, option_gpu: str, submit: str = "submit") -> str:
    token = csrf(client)
    form = seed_form(checkpointing="offload", loss="chunked", tokens="6400000")
    form["prices"] = "rtx-pro-6000=1.80"
    page = client.post("/estimate", data=form)
    options = re.findall(r'name="option" value="([^"]+)"', page.text)
    assert f"0:{option_gpu}" in options
    bodies = re.findall(r'name="request_json" value="([^"]+)"', page.text)
    saved = client.post(
        "/quotes",
        data={
            "csrf_token": token,
            "option": f"0:{option_gpu}",
            "request_json": [html.unescape(b) for b in bodies],
            "title": "seed on one card",
            "token": REQUESTER_TOKEN,
            "submit": submit,
        },
        follow_redirects=False,
    )
    assert saved.status_code == 303, saved.text[:2000]
    return str(saved.headers["location"]).rsplit("/", 1)[1]


def test_a_quote_is_for_the_chosen_option_with_its_total_and_override(
    sqlite_client: TestClient,
) -> None:
    quote_id = _post_and_save(sqlite_client, "rtx-pro-6000")
    api = sqlite_client.get(f"/v1/quotes/{quote_id}").json()
    assert api["request"]["gpus"] == ["rtx-pro-6000"]
    option = api["estimate"]["training"]["options"]["rtx-pro-6000"]
    page = sqlite_client.get(f"/quotes/{quote_id}").text
    assert 'id="quote-model">qwen3.5-27b<' in page
    assert 'id="quote-option">rtx-pro-6000' in page
    assert f"<strong>{option['cost_usd']:,.2f} USD</strong>" in page
    assert "at 1.80 USD per GPU-hour" in page
    assert 'id="quote-override"' in page and "override (rtx-pro-6000=1.8 USD/h)" in page
    # the recommendation as the result page showed it: every GPU option of the estimate
    saved = api["estimate"]["recommendation"]
    assert {r["gpu"] for r in saved["rows"]} == {"a100-80gb", "rtx-pro-6000", "h200", "2xh200"}
    assert 'id="quote-recommendation"' in page
    token = csrf(sqlite_client, f"/quotes/{quote_id}")
    sqlite_client.post(
        f"/quotes/{quote_id}/decision",
        data={"csrf_token": token, "decision": "reprice", "token": REQUESTER_TOKEN},
    )
    again = sqlite_client.get(f"/v1/quotes/{quote_id}").json()
    assert again["version"] == 2 and again["estimate"]["recommendation"] == saved
    catalog_priced = _post_and_save(sqlite_client, "h200")
    other = sqlite_client.get(f"/quotes/{catalog_priced}").text
    assert 'id="quote-override"' not in other and "catalog:" in other


def test_drafts_are_submitted_and_the_list_filters_by_status(sqlite_client: TestClient) -> None:
    draft = _post_and_save(sqlite_client, "h200", submit="draft")
    pending = _post_and_save(sqlite_client, "rtx-pro-6000")
    page = sqlite_client.get(f"/quotes/{draft}").text
    assert 'id="quote-status">draft' in page and 'id="submit-form"' in page
    token = csrf(sqlite_client, "/quotes")
    listed = sqlite_client.post(
        "/quotes/list", data={"csrf_token": token, "token": APPROVER_TOKEN}
    ).text
    assert pending in listed and draft not in listed  # pending by default
    assert "<td>rtx-pro-6000</td>" in listed and "<td>qwen3.5-27b</td>" in listed
    everything = sqlite_client.post(
        "/quotes/list", data={"csrf_token": token, "token": APPROVER_TOKEN, "status": "all"}
    ).text
    assert pending in everything and draft in everything
    submitted = sqlite_client.post(
        f"/quotes/{draft}/decision",
        data={"csrf_token": token, "decision": "submit", "token": REQUESTER_TOKEN},
    )
    assert submitted.status_code == 200 and 'id="quote-status">pending' in submitted.text


def test_without_an_approver_the_page_says_how_and_keeps_the_comment(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url, approver_tokens="")
    with TestClient(create_app(settings)) as client:
        quote_id = _post_and_save(client, "h200")
        page = client.get(f"/quotes/{quote_id}").text
        assert 'id="no-approver"' in page and "trainfit token create --role approver" in page
        token = csrf(client, f"/quotes/{quote_id}")
        refused = client.post(
            f"/quotes/{quote_id}/decision",
            data={
                "csrf_token": token,
                "decision": "approve",
                "token": REQUESTER_TOKEN,
                "comment": "typed with care",
            },
        )
        assert refused.status_code == 403
        assert "trainfit token create --role approver" in refused.text
        assert 'value="typed with care"' in refused.text
        audit = client.get(f"/v1/quotes/{quote_id}").json()["audit"]
        assert audit[-1]["outcome"] == "denied"


def _seed_memtest(**result_changes: Any) -> dict[str, Any]:
    return seed_case_memtest(
        lambda _result: {
            "params": 54_000_000_000,
            "grads": 0,
            "optimizer": 420_000_000,
            "activations": 7_000_000_000,
            "host": 9_000_000_000,
        },
        **result_changes,
    )


def _upload(client: TestClient, doc: dict[str, Any], token: str = UPLOAD_TOKEN) -> Any:
    form_token = csrf(client, "/memtests")
    return client.post(
        "/memtests/upload",
        data={"csrf_token": form_token, "token": token},
        files={"memtest_file": ("memtest.json", json.dumps(doc).encode(), "application/json")},
        follow_redirects=False,
    )


def test_memtest_upload_in_the_form_and_its_comparison(sqlite_client: TestClient) -> None:
    refused = _upload(sqlite_client, _seed_memtest(), token="not-an-upload-token")
    assert refused.status_code == 403 and "not an upload token" in refused.text
    bad = _upload(sqlite_client, {"schema": "nope"})
    assert bad.status_code == 422 and "trainfit.memtest/1" in bad.text
    done = _upload(sqlite_client, _seed_memtest())
    assert done.status_code == 303
    page = sqlite_client.get(done.headers["location"]).text
    rows = re.findall(r"<tr><td class=\"num\">16,000</td><td>(\w+)</td>", page)
    assert rows == ["params", "grads", "optimizer", "activations", "host"]
    assert "estimated − measured" in page and "(GiB)" in page
    assert 'id="speeds"' in page and "estimated tokens/s on h200" in page
    calibrate = _href(page, "calibrate-16000")
    result = sqlite_client.get(calibrate)
    assert result.status_code == 200, result.text[:2000]
    assert 'id="calibrated"' in result.text and "420 tokens/s" in result.text


def test_a_form_with_more_parts_than_the_page_reads_is_422_naming_the_body(
    sqlite_client: TestClient,
) -> None:
    """The web upload reads one file and at most 10 fields; a hand-made form with more gets
    what the REST upload answers, a 422 naming the body, not starlette's bare 400."""
    form_token = csrf(sqlite_client, "/memtests")
    file = {"memtest_file": ("memtest.json", json.dumps(_seed_memtest()).encode(), "x/json")}
    fields = {"csrf_token": form_token, "token": UPLOAD_TOKEN}
    ok = sqlite_client.post("/memtests/upload", data=fields, files=file, follow_redirects=False)
    assert ok.status_code == 303, ok.text
    many = sqlite_client.post(
        "/memtests/upload",
        data={**fields, "note": ["a"] * 9},  # 2 + 9 = 11 fields
        files=file,
        follow_redirects=False,
    )
    assert many.status_code == 422, many.text
    detail = many.json()["detail"][0]
    assert detail["loc"] == ["body"] and "Too many fields" in detail["msg"]
    two = sqlite_client.post(
        "/memtests/upload",
        data=fields,
        files=[("memtest_file", ("a.json", b"{}", "x/json")), ("other", ("b.json", b"{}", "x/y"))],
        follow_redirects=False,
    )
    assert two.status_code == 422 and "Too many files" in two.json()["detail"][0]["msg"]


def test_small_cpu_memtests_are_shown_in_mib(sqlite_client: TestClient) -> None:
    doc = _seed_memtest(peak_allocated_bytes=300 * 2**20, peak_reserved_bytes=320 * 2**20)
    tiny = Path(__file__).resolve().parents[1] / "data" / "configs" / "tiny-llama.json"
    doc["model"] = dict(doc["model"], name="tiny-llama", config=json.loads(tiny.read_text()))
    doc["setup"] = dict(doc["setup"], lora_targets=["all-linear"])
    doc["environment"] = dict(doc["environment"], device="cpu", gpu_name="")
    page = sqlite_client.get(_upload(sqlite_client, doc).headers["location"]).text
    assert "Peak per sequence length (MiB)" in page
    assert '<td class="num">300.0</td>' in page
    assert 'id="no-speed"' in page and "nothing to calibrate" in page


def test_api_docs_come_from_this_server(sqlite_client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        page = sqlite_client.get(path)
        assert page.status_code == 200
        assert "cdn." not in page.text and "fonts.googleapis" not in page.text
        urls = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert urls and all(u.startswith("/") for u in urls), urls
        for url in urls:
            assert sqlite_client.get(url).status_code == 200, url
        assert "cdn" not in page.headers["content-security-policy"]


def test_hub_id_on_the_form_offline_names_the_field(
    sqlite_client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "trainfit"))
    page = sqlite_client.post(
        "/estimate", data=seed_form(model_source="hub", hub_id="some-org/not-cached-model")
    )
    assert page.status_code == 422
    assert re.search(r'id="hub_id"[^>]*aria-invalid="true"', page.text)
    assert 'id="hub_id-error"' in page.text and "HF_HUB_OFFLINE" in page.text
    not_an_id = sqlite_client.post("/estimate", data=seed_form(model_source="hub", hub_id="x"))
    assert 'id="hub_id-error"' in not_an_id.text


def test_a_training_config_on_the_form(sqlite_client: TestClient) -> None:
    text = (EXAMPLES / "axolotl-qlora-llama31-8b.yml").read_bytes()
    page = sqlite_client.post(
        "/estimate",
        data=seed_form(model_source="train_config", seq_lens="", gpus=["h200"], gpus_extra=""),
        files={"train_config_file": ("axolotl.yml", text, "application/x-yaml")},
    )
    assert page.status_code == 200, page.text[:3000]
    assert "Training config: axolotl (axolotl.yml)" in page.text
    assert "qlora" in page.text and "rank 32" in page.text
    bad = sqlite_client.post(
        "/estimate",
        data=seed_form(train_config_text="adapter: [unclosed", gpus_extra=""),
    )
    assert bad.status_code == 422 and 'id="train_config_text-error"' in bad.text


def test_a_refused_save_keeps_the_result_and_what_was_typed(sqlite_url: str) -> None:
    for settings, words in (
        (make_settings(sqlite_url), "not a requester or approver token"),
        (
            make_settings(sqlite_url, requester_tokens="", approver_tokens=""),
            "trainfit token create --role requester",
        ),
    ):
        with TestClient(create_app(settings)) as client:
            token = csrf(client)
            page = client.post("/estimate", data=seed_form(checkpointing="offload", loss="chunked"))
            query = html.unescape(re.search(r'name="query" value="([^"]+)"', page.text)[1])
            bodies = re.findall(r'name="request_json" value="([^"]+)"', page.text)
            refused = client.post(
                "/quotes",
                data={
                    "csrf_token": token,
                    "option": "0:rtx-pro-6000",
                    "request_json": [html.unescape(b) for b in bodies],
                    "query": query,
                    "title": "my title",
                    "comment": "typed with care",
                    "token": "wrong-token-here",
                },
            )
            assert refused.status_code == 403
            assert 'id="quote-error"' in refused.text and words in refused.text
            assert 'value="typed with care"' in refused.text and 'value="my title"' in refused.text
            assert re.search(r'value="0:rtx-pro-6000"[^>]*checked', refused.text)
            assert 'id="fit-table"' in refused.text


def test_a_memtest_measured_on_an_h200_shows_its_speed_next_to_the_estimate(
    sqlite_client: TestClient,
) -> None:
    """The committed H200 file as uploaded: torch reports CUDA's total (143,156 MiB), below the
    catalog's driver-reported 143,771 MiB, and the page still knows the card."""
    path = (
        Path(__file__).resolve().parents[1]
        / "data/memtests/memtest_h200_2026-12-04_hf-llama-lora.json"
    )
    done = _upload(sqlite_client, json.loads(path.read_text()))
    assert done.status_code == 303
    page = sqlite_client.get(done.headers["location"]).text
    assert 'id="speeds"' in page and "estimated tokens/s on h200" in page
    assert len(re.findall(r'id="calibrate-\d+"', page)) == 3  # every measured length
    assert 'id="outside-note"' in page and "outside the allocator, measured" in page
    assert page.count("0.7</td>") >= 3  # 766.8 MiB measured and assumed, in GiB


def test_a_cpu_memtest_with_simulated_reserved_shows_it_labelled_as_simulated(
    sqlite_client: TestClient,
) -> None:
    doc = _seed_memtest(peak_allocated_bytes=300 * 2**20, peak_reserved_bytes=None)
    doc["environment"].update(
        {
            "device": "cpu",
            "gpu_name": None,
            "total_memory_bytes": None,
            "memory_counter": "storage_tracker",
        }
    )
    doc["results"][0]["simulated_reserved_bytes"] = int(12.34 * 2**30)
    done = _upload(sqlite_client, doc)
    assert done.status_code == 303, done.text[:500]
    page = sqlite_client.get(done.headers["location"]).text
    assert "<th>simulated reserved</th>" in page and 'id="simulated-note"' in page
    assert "12.3</td>" in page  # in the reserved column, in GiB (the estimate is the 27B's)


def test_a_regex_target_with_commas_on_the_form_is_one_pattern(sqlite_client: TestClient) -> None:
    """`re:` on the form is peft's regex target; its `{1,2}` is not a list separator."""
    pattern = (
        r"re:model\.language_model\.layers\.\d{1,2}\."
        r"(self_attn\.(q|k|v|o)_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
        r"|mlp\.(gate|up|down)_proj)"
    )
    names = sqlite_client.post("/estimate", data=seed_form())
    regex = sqlite_client.post("/estimate", data=seed_form(lora_targets=pattern))
    assert regex.status_code == 200, regex.text[:2000]

    def peaks(page: Any) -> list[str]:
        return re.findall(r'<td class="num peak">([\d.,]+)</td>', page.text)

    assert peaks(regex) == peaks(names) and peaks(names)
