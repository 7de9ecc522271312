"""The pages in a real browser (Debian's chromium driven by Playwright): fill the form for the
seed case, see the fit table and the chart, save a quote, approve it with the token.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from service_support import APPROVER_TOKEN, REQUESTER_TOKEN, SEED_TARGETS

CHROMIUM = os.environ.get("TRAINFIT_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} missing: apt-get install -y chromium (no playwright downloads)",
    ),
]
pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")


def test_seed_case_in_the_browser(live_server: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
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
            page.screenshot(path=str(ARTIFACTS / "browser_1_form.png"), full_page=True)
            page.click("#submit-estimate")

            table = page.locator("#fit-table")
            expect(table).to_be_visible()
            expect(table.locator("tbody tr")).to_have_count(12)
            last = table.locator("tbody tr").last.locator("td.verdict")
            expect(last).to_have_text(["no", "no", "no", "fits"])
            expect(page.locator("#memory-chart svg.chart")).to_be_visible()
            peak_48k_gpu_chunked = table.locator("tbody tr").nth(10).locator("td").nth(3)
            bar = (
                page.locator("#memory-chart g.bar.option:not(.per-card)")
                .nth(10)
                .locator(".bar-value")
            )
            assert bar.text_content() == f"{peak_48k_gpu_chunked.inner_text()} GiB"
            page.screenshot(path=str(ARTIFACTS / "browser_2_result.png"), full_page=True)

            page.select_option("#quote-variant", index=0)
            page.fill("#quote-token", REQUESTER_TOKEN)
            page.click("#save-quote")
            expect(page.locator("#quote-status")).to_have_text("pending")
            assert "/quotes/" in page.url
            page.screenshot(path=str(ARTIFACTS / "browser_3_quote.png"), full_page=True)

            page.fill("#approver-token", APPROVER_TOKEN)
            page.fill("#decision-comment", "go, one A100 with the offload")
            page.click("#approve")
            expect(page.locator("#quote-status")).to_have_text("approved")
            expect(page.locator("#audit tbody tr")).to_have_count(2)
            expect(page.locator("#audit tbody tr").first).to_contain_text("alice")
            page.screenshot(path=str(ARTIFACTS / "browser_4_approved.png"), full_page=True)
        finally:
            browser.close()
