"""End to end: a real training run in the background, the app served by `fastrl_app.launch.serve`, headless Chromium.

Checks that a new step appears on the Budget page without a reload, that a box selection on the Embeddings map
shows the selected rollouts (a paged table with their images), and that a Rollouts deep link opens its group; saves screenshots
of every page (to $FASTRL_SCREENSHOTS, e.g. docs/screenshots, else a temp folder). Needs Debian's chromium (`make test` installs it) and Playwright's Python API.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_app_pages import REPO, merged_step, train_command

from fastrl_app.launch import serve
from fastrl_core import store

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_pages import READY  # noqa: E402  (a page is drawn: script run ended, no placeholder, charts drawn)

CHROMIUM = "/usr/bin/chromium"
# README's screenshots are refreshed with FASTRL_SCREENSHOTS=docs/screenshots; otherwise they go to a temp folder.
SCREENSHOTS = Path(os.environ.get("FASTRL_SCREENSHOTS") or tempfile.mkdtemp(prefix="fastrl-screenshots-"))
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium; `make test` does)")]

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_run(store_dir: Path, name: str, steps: int) -> subprocess.Popen:
    """A real training run (`python -m fastrl_app.cli train`) in the background; its stderr (the progress bar) goes to
    `<store_dir>/<name>.stderr`, a file, not a pipe: a long run filled an unread pipe, blocked, and outlived teardown."""
    with open(store_dir / f"{name}.stderr", "w") as stderr:
        return subprocess.Popen(train_command(store_dir, name, f"steps={steps}"), cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A finished real GRPO run, then a real FastRL run training in the background, and the app on them."""
    store_dir = tmp_path_factory.mktemp("browser_store")
    baseline = start_run(store_dir, "grpo", 10)
    assert baseline.wait(300) == 0, (store_dir / "grpo.stderr").read_text()[-3000:]
    live = start_run(store_dir, "fastrl", 1000)  # stopped at teardown
    port = free_port()
    app = serve(store_dir, port=port, timeout=90)
    try:
        wait_for(lambda: live_run_id(store_dir) and store.latest_step(store_dir, live_run_id(store_dir)) is not None,
                 120, "the live run's first step")
        yield store_dir, f"http://127.0.0.1:{port}"
    finally:
        for process in (live, app):
            process.terminate()
            process.wait(30)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (Playwright's sync API runs once per process)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(served, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.set_default_timeout(60_000)
    yield page
    page.close()


def metric_value(page, label: str) -> str:
    return page.locator("[data-testid='stMetric']", has_text=label).locator(
        "[data-testid='stMetricValue']").inner_text()


def live_run_id(store_dir: Path) -> str | None:
    runs = store.read_runs(store_dir)
    live = runs.loc[runs["pruner"] == "fastrl", "run_id"]
    return live.iloc[0] if len(live) else None


def test_budget_page_shows_new_steps_live_without_reload(served, page):
    store_dir, url = served
    page.goto(f"{url}/budget?run={live_run_id(store_dir)}")
    first = int(page.locator("[data-testid='stMetric']", has_text="Latest step").locator(
        "[data-testid='stMetricValue']").inner_text())
    page.evaluate("window.__no_reload_marker = 42")
    # first a newer step in the store (as slow as the machine makes it), then the page's 2 s refresh shows it
    wait_for(lambda: (store.latest_step(store_dir, live_run_id(store_dir)) or 0) > first, 1800, "a newer step")
    later = wait_for(lambda: (v := int(metric_value(page, "Latest step"))) > first and v, 120,
                     "the newer step on the Budget page")
    assert later > first
    assert page.evaluate("window.__no_reload_marker") == 42, "the page was reloaded"
    page.wait_for_selector(".js-plotly-plot")
    assert page.locator("[data-testid='stException']").count() == 0


def test_box_selection_on_the_map_shows_the_rollouts_with_images(served, page):
    store_dir, url = served
    page.goto(f"{url}/embeddings?run={live_run_id(store_dir)}")
    page.wait_for_selector(".js-plotly-plot")
    # PCA first; the page redraws by itself once the background UMAP fit is done
    page.wait_for_selector("text=UMAP map of", timeout=300_000)  # 20-120 s seen on 2 busy cores
    page.wait_for_function(READY)  # the redrawn map, before dragging on it
    drag = page.locator(".js-plotly-plot .nsewdrag").first
    box = drag.bounding_box()
    start = (box["x"] + box["width"] * 0.15, box["y"] + box["height"] * 0.15)
    end = (box["x"] + box["width"] * 0.85, box["y"] + box["height"] * 0.85)
    page.mouse.move(*start)
    page.mouse.down()
    for i in range(1, 11):
        page.mouse.move(start[0] + (end[0] - start[0]) * i / 10, start[1] + (end[1] - start[1]) * i / 10)
    page.mouse.up()
    page.wait_for_selector("text=selected rollouts", timeout=30_000)
    page.wait_for_selector("text=/Rows 1–\\d+ of \\d+/")  # a page of the selection's table (images in its grid)
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "embeddings.png"))


def test_rollouts_deep_link_and_the_other_pages_render(served, page):
    store_dir, url = served
    run_id = live_run_id(store_dir)
    groups = store.read_groups(store_dir, run_id, step=1)
    prompt = groups.loc[(groups["kept"] > 0) & (groups["kept"] < groups["sampled"]), "prompt_id"]
    prompt = prompt.iloc[0] if len(prompt) else groups["prompt_id"].iloc[0]
    page.goto(f"{url}/rollouts?run={run_id}&step=1&prompt={prompt}")
    page.wait_for_selector(f"text=prompt {prompt}")
    page.wait_for_selector("[data-testid='stImage'] img")  # the caption can be drawn before the image arrives
    assert page.locator("[data-testid='stImage'] img").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "rollouts.png"))
    for name, path, marker in (("runs", "runs", "Compare runs"),
                               ("budget", f"budget?run={run_id}", "Where plain GRPO's rollouts went"),
                               ("demo", "demo", "Speed and accuracy against GRPO")):
        page.goto(f"{url}/{path}")
        page.wait_for_selector(f"text={marker}")
        page.wait_for_function(READY)  # drawn, charts included, before the screenshot
        assert page.locator("[data-testid='stException']").count() == 0, name
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def test_no_deploy_button_and_a_question_is_text_that_fetches_nothing(tmp_path, monkeypatch, browser):
    """The app launched outside the checkout (no .streamlit/config.toml in reach) shows no Deploy button, and a
    question holding a Markdown image is shown as its text: the browser never requests the image."""
    import http.server
    import threading

    requests = []

    class Tracker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            requests.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    tracker = http.server.HTTPServer(("127.0.0.1", 0), Tracker)
    threading.Thread(target=tracker.serve_forever, daemon=True).start()
    question = f"Find x. ![t](http://127.0.0.1:{tracker.server_port}/track.png)"
    with store.RunWriter(tmp_path / "store", name="bench-fastrl-seed0", config={"rollouts_per_prompt": 8}, model="m",
                         dataset="d", objective="grpo", pruner="fastrl", budget="adaptive") as writer:
        store.step_rows(merged_step(0, "fastrl", question)).write_to(writer)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    port = free_port()
    app = serve(tmp_path / "store", port=port, timeout=90)
    tab = browser.new_page(viewport={"width": 1400, "height": 1800})
    try:
        tab.set_default_timeout(60_000)
        tab.goto(f"http://127.0.0.1:{port}/rollouts?run={writer.run_id}&step=0&prompt=p0")
        tab.wait_for_selector(".js-plotly-plot")
        tab.wait_for_selector("[data-testid='stToolbar']")  # waits on the toolbar, not on a fixed time
        tab.wait_for_selector(f"text={question}")  # the question's own characters, on the page
        assert tab.locator("[data-testid='stToolbar']").count() == 1  # the toolbar is there ...
        assert tab.locator("[data-testid='stAppDeployButton']").count() == 0  # ... without Deploy
        assert requests == []  # the question's image link was not followed
        assert tab.locator("[data-testid='stException']").count() == 0
    finally:
        tab.close()
        app.terminate()
        app.wait(30)
        tracker.shutdown()
    assert requests == []
