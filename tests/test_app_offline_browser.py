"""Headless Chromium on every dashboard address: no request leaves 127.0.0.1 (an offline cluster has no font host,
and any other host would learn who is looking), the favicon is inline, and `/home` and `/runs` open the Runs page
without a "Page not found" dialog. Needs Debian's chromium and Playwright's Python API, as test_app_browser."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from test_app_browser import CHROMIUM, READY, free_port
from test_app_pages import merged_step

from fastrl_app.launch import serve
from fastrl_app import metrics
from fastrl_core import store

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium; `make test` does)")]
ADDRESSES = ("", "runs", "home", "budget", "rollouts", "embeddings", "demo")
LOCAL = {"127.0.0.1"}


def outside(url: str) -> bool:
    """Whether loading `url` asks a host other than this machine's app (data: and blob: URLs ask no host)."""
    parsed = urlparse(url)
    return parsed.scheme not in ("data", "blob", "about") and parsed.hostname not in LOCAL


def test_no_request_leaves_the_machine_and_every_address_opens(tmp_path):
    for method in ("fastrl", "grpo"):  # a FastRL run and its GRPO run, as the bench names them, three steps each
        with store.RunWriter(tmp_path, name=metrics.bench_run_name(method, 0),
                             config={"rollouts_per_prompt": 8, "seed": 0}, model="m", dataset="d", objective="grpo",
                             pruner="fastrl" if method == "fastrl" else "none",
                             budget="adaptive" if method == "fastrl" else "fixed") as writer:
            for step in range(3):
                store.step_rows(merged_step(step, method, question="Find x.")).write_to(writer)
        time.sleep(1.1)
    from playwright.sync_api import sync_playwright

    port = free_port()
    app = serve(tmp_path, port=port, timeout=90)
    requested: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            tab = browser.new_page(viewport={"width": 1400, "height": 1800})
            tab.set_default_timeout(120_000)
            tab.on("request", lambda request: requested.append(request.url))
            tab.on("websocket", lambda socket: requested.append(socket.url))
            for address in ADDRESSES:
                tab.goto(f"http://127.0.0.1:{port}/{address}")
                tab.wait_for_selector("[data-testid='stMainBlockContainer']")
                tab.wait_for_function(READY)
                assert tab.get_by_text("Page not found").count() == 0, address
                assert tab.locator("[data-testid='stException']").count() == 0, address
                if address in ("", "runs", "home"):
                    assert tab.locator("h1").first.inner_text() == "Runs", address
                icon = tab.evaluate("document.querySelector(\"link[rel='shortcut icon']\").href")
                assert icon.startswith("data:image/svg+xml"), (address, icon)  # drawn inline, fetched from nowhere
            browser.close()
    finally:
        app.terminate()
        app.wait(30)
    assert any(urlparse(url).hostname == "127.0.0.1" for url in requested)  # the listener saw the page's own
    assert [url for url in requested if outside(url)] == []
