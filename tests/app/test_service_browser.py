"""The web app in a real browser (Debian's chromium driven by Playwright; never a downloaded
browser), as issue 13's users walk it:

- the engineer prices seed 000's case; the chart's bar label equals the table's peak;
- saves a quote for the RTX PRO 6000 option with a typed price (an override);
- the approver approves it with a token; the quote page shows model, setup, option, total and
  the override flag;
- someone with a memtest uploads it in the form, reads the per-component comparison and
  calibrates the estimate from it; the API docs render.

Every page is captured at 1366 px and 390 px in test-artifacts/, a page scrolls sideways at
390 px never (asserted), and no request leaves 127.0.0.1 (asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from service_support import (
    APPROVER_TOKEN,
    REQUESTER_TOKEN,
    SEED_TARGETS,
    UPLOAD_TOKEN,
    seed_case_memtest,
)

CHROMIUM = os.environ.get("TRAINFIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
DESKTOP, PHONE = 1366, 390

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} missing: apt-get install -y chromium (no playwright downloads)",
    ),
]
pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")


def _capture(page: Any, name: str) -> None:
    """Screenshots at both widths; at 390 px the document must not be wider than the screen."""
    page.set_viewport_size({"width": DESKTOP, "height": 900})
    page.screenshot(path=str(ARTIFACTS / f"{name}_desktop.png"), full_page=True)
    page.set_viewport_size({"width": PHONE, "height": 844})
    wide = page.evaluate("document.documentElement.scrollWidth")
    page.screenshot(path=str(ARTIFACTS / f"{name}_390.png"), full_page=True)
    assert wide <= PHONE, f"{name}: {wide} px wide in a {PHONE} px viewport"
    page.set_viewport_size({"width": DESKTOP, "height": 900})


def _memtest_file(tmp_path: Path) -> Path:
    """A CUDA memtest of the seed case with the probe's components at the peak."""
    doc = seed_case_memtest(
        lambda result: {
            "params": 54_000_000_000,
            "grads": 200_000_000,
            "optimizer": 420_000_000,
            "activations": result["peak_allocated_bytes"] - 54_620_000_000,
            "host": 9_000_000_000,
        }
    )
    path = tmp_path / "memtest_seed_h200.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_four_users_in_the_browser(live_server: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    origin = urlsplit(live_server).netloc
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": DESKTOP, "height": 900})
            page.on("request", lambda r: requested.append(r.url))

            # the engineer: seed 000's case, with a price for the card the catalog has none for
            page.goto(live_server + "/")
            page.select_option("#preset", "qwen3.5-27b")
            page.select_option("#method", "lora")
            page.fill("#lora_rank", "16")
            page.fill("#lora_targets", ",".join(SEED_TARGETS))
            page.select_option("#optimizer", "adamw-8bit")
            for box in ("#ckpt-offload", "#ckpt-gpu", "#loss-chunked", "#loss-full"):
                page.check(box)
            page.fill("#seq_lens", "16000,32000,48000")
            page.select_option("#gpus", ["a100-80gb", "rtx-pro-6000", "h200"])
            page.fill("#gpus_extra", "2xh200")
            page.select_option("#profile", "seed-000")
            page.fill("#tokens", "6400000")
            page.fill("#prices", "rtx-pro-6000=1.80")
            _capture(page, "1_form")
            page.click("#submit-estimate")

            table = page.locator("#fit-table")
            expect(table.locator("tbody tr")).to_have_count(12)
            last = table.locator("tbody tr").last.locator("td.verdict")
            expect(last.nth(0)).to_have_text("no")
            expect(last.nth(3)).to_contain_text("fits")
            # the chart's bar for 48k, on the GPU, chunked says the table's peak
            peak = table.locator("tbody tr").nth(10).locator("td.peak").inner_text()
            bars = page.locator("#memory-chart g.bar.option:not(.per-card) .bar-value")
            assert bars.nth(10).text_content() == f"{peak} GiB"
            expect(page.locator("#max-context-chart g.bar")).to_have_count(4 * 4)
            _capture(page, "2_result")

            # the estimate's link re-renders the same table
            permalink = page.locator("#permalink").get_attribute("href")
            result_url = page.url
            page.goto(live_server + str(permalink))
            expect(page.locator("#fit-table tbody tr").nth(10).locator("td.peak")).to_have_text(
                peak
            )
            markdown = page.request.get(
                live_server + str(page.locator("#copy-md").get_attribute("href"))
            )
            assert markdown.ok and f"| {peak} |" in markdown.text()
            assert result_url.endswith("/estimate")

            # save a quote for RTX PRO 6000 (offload, chunked fits it) with the typed price
            option = page.locator(
                '#options-table tr[data-option$=":rtx-pro-6000"]:has(td.verdict.fits)'
            ).first
            option_text = option.locator("td").nth(1).inner_text()
            option.locator('input[type="radio"]').check()
            assert option.locator(".flag.override").count() == 1
            page.fill("#quote-title", "seed 000 on one RTX PRO 6000")
            page.fill("#quote-token", REQUESTER_TOKEN)
            page.click("#save-quote")
            expect(page.locator("#quote-status")).to_have_text("pending")
            _capture(page, "3_quote_pending")

            # the approver: a wrong token is refused, audited, and the comment is kept
            page.fill("#approver-token", "not-the-approver-token")
            page.fill("#decision-comment", "go, one RTX PRO 6000")
            page.click("#approve")
            expect(page.locator("#decision-error")).to_contain_text("not an approver token")
            expect(page.locator("#decision-comment")).to_have_value("go, one RTX PRO 6000")
            page.fill("#approver-token", APPROVER_TOKEN)
            page.click("#approve")
            expect(page.locator("#quote-status")).to_have_text("approved")
            expect(page.locator("#quote-model")).to_have_text("qwen3.5-27b")
            expect(page.locator("#quote-setup")).to_contain_text("rank 16")
            expect(page.locator("#quote-option")).to_contain_text("rtx-pro-6000")
            expect(page.locator("#quote-total")).to_contain_text("USD")
            expect(page.locator("#quote-override")).to_be_visible()
            expect(page.locator("#quote-price-source")).to_contain_text("rtx-pro-6000=1.8")
            expect(page.locator("#audit tbody tr.denied")).to_have_count(1)
            _capture(page, "4_quote_approved")
            assert "offload" in option_text.lower() or "on the gpu" in option_text.lower()

            # the approver's list: pending by default, then all with model, GPU and USD
            page.goto(live_server + "/quotes")
            page.fill("#quotes-token", APPROVER_TOKEN)
            page.select_option("#quotes-status", "all")
            page.click("#quotes-list")
            row = page.locator("#quotes-table tbody tr").first
            expect(row).to_contain_text("rtx-pro-6000")
            expect(row).to_contain_text("qwen3.5-27b")
            _capture(page, "5_quotes")

            # someone with a memtest: upload it in the form, compare, calibrate
            page.goto(live_server + "/memtests")
            page.set_input_files("#memtest-file", str(_memtest_file(tmp_path)))
            page.fill("#upload-token", UPLOAD_TOKEN)
            page.click("#upload-memtest")
            expect(page.locator("#components tbody tr")).to_have_count(2 * 5)
            expect(page.locator("#sign-convention")).to_contain_text("estimated − measured")
            expect(page.locator("#speeds tbody tr")).to_have_count(2)
            _capture(page, "6_memtest")
            page.click("#calibrate-16000")
            expect(page.locator("#calibrated")).to_contain_text("420 tokens/s")
            _capture(page, "7_calibrated")

            # the API docs, from the app's own files
            page.goto(live_server + "/docs")
            expect(page.locator(".swagger-ui .info")).to_be_visible(timeout=15000)
            _capture(page, "8_docs")
        finally:
            browser.close()
    outside = [u for u in requested if urlsplit(u).scheme not in ("data", "blob")]
    outside = [u for u in outside if urlsplit(u).netloc != origin]
    assert not outside, f"requests left {origin}: {outside[:5]}"
