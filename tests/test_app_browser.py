"""End to end: a run writing steps in the background, the app served by `app.launch.serve`, headless Chromium.

Checks that a new step appears on the Budget page without a reload, that a box selection on the Embeddings map
shows the selected rollouts with their images, and that a Rollouts deep link opens its group; saves screenshots
of every page to docs/screenshots/. Needs Debian's chromium (`make test` installs it) and Playwright's Python API.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.launch import serve
from fastrl_core import store

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium)")]

# A run that writes one step every `pause` seconds through RunWriter: the store's synthetic steps with the
# keep rule applied (zero advantage pruned, at most 4 kept per group), as the trainer would write them.
WRITER = textwrap.dedent("""
    import sys, time
    from fastrl_core.store import RunWriter
    from fastrl_core.store.synthetic import synthetic_step
    store_dir, name, steps, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    pruner = "none" if name == "grpo" else "fastrl"
    writer = RunWriter(store_dir, name=name, config={"steps": steps}, model="embedded", dataset="synthetic",
                       objective="grpo", pruner=pruner, budget="fixed" if pruner == "none" else "adaptive")
    pngs, clock = {}, 0.0
    for step in range(steps):
        kw = synthetic_step(step, prompts=16, rollouts_per_prompt=8, sketch_dim=64, dataset_size=48, pngs=pngs)
        groups = {}
        for row in kw["rollouts"]:
            groups.setdefault(row["prompt_id"], []).append(row)
        for rows in groups.values():
            ranked = sorted((r for r in rows if abs(r["advantage"]) > 1e-6), key=lambda r: -abs(r["advantage"]))
            top = {id(r) for r in ranked[:4]} if pruner != "none" else {id(r) for r in rows}
            for row in rows:
                row["kept"] = id(row) in top
                row["weight"] = 1.0 if row["kept"] else None
                row["reason"] = "KEPT" if row["kept"] else (
                    "ZERO_ADVANTAGE" if abs(row["advantage"]) <= 1e-6 else "REDUNDANT")
        for group in kw["groups"]:
            group["kept"] = sum(r["kept"] for r in groups[group["prompt_id"]])
        kw["step_row"]["rollouts_kept"] = sum(r["kept"] for r in kw["rollouts"])
        clock += 2.0 if pruner == "none" else 1.0
        kw["step_row"]["wall_time"] = clock
        writer.write_step(step, **kw)
        if step % 5 == 0 or step == steps - 1:
            accuracy = 0.3 + (0.4 if pruner == "none" else 0.5) * step / steps
            writer.write_eval(step, "test", accuracy, 256, wall_time=clock)
        time.sleep(pause)
    writer.finish()
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_run(store_dir: Path, name: str, steps: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(store_dir), name, str(steps), str(pause)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


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
    """A finished GRPO baseline, then a live FastRL run writing a step every 1.5 s, and the app on them."""
    store_dir = tmp_path_factory.mktemp("browser_store")
    baseline = start_run(store_dir, "grpo", 20, 0.0)
    assert baseline.wait(120) == 0
    live = start_run(store_dir, "fastrl", 200, 1.5)
    port = free_port()
    app = serve(store_dir, port=port, timeout=90)
    try:
        wait_for(lambda: len(store.read_runs(store_dir)) == 2 and store.latest_step(
            store_dir, store.read_runs(store_dir).sort_values("started")["run_id"].iloc[-1]) is not None,
            60, "the live run's first step")
        yield store_dir, f"http://127.0.0.1:{port}"
    finally:
        for process in (live, app):
            process.terminate()
            process.wait(30)


@pytest.fixture(scope="module")
def page(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(60_000)
        yield page
        browser.close()


def metric_value(page, label: str) -> str:
    return page.locator("[data-testid='stMetric']", has_text=label).locator(
        "[data-testid='stMetricValue']").inner_text()


def live_run_id(store_dir: Path) -> str:
    runs = store.read_runs(store_dir)
    return runs.loc[runs["pruner"] == "fastrl", "run_id"].iloc[0]


def test_budget_page_shows_new_steps_live_without_reload(served, page):
    store_dir, url = served
    page.goto(f"{url}/budget?run={live_run_id(store_dir)}")
    first = int(page.locator("[data-testid='stMetric']", has_text="Latest step").locator(
        "[data-testid='stMetricValue']").inner_text())
    page.evaluate("window.__no_reload_marker = 42")
    later = wait_for(lambda: (v := int(metric_value(page, "Latest step"))) > first and v, 30,
                     "a new step on the Budget page")
    assert later > first
    assert page.evaluate("window.__no_reload_marker") == 42, "the page was reloaded"
    page.wait_for_selector(".js-plotly-plot")
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "budget.png"))


def test_box_selection_on_the_map_shows_the_rollouts_with_images(served, page):
    store_dir, url = served
    page.goto(f"{url}/embeddings?run={live_run_id(store_dir)}")
    page.wait_for_selector(".js-plotly-plot")
    # PCA first; the page redraws by itself once the background UMAP fit is done
    page.wait_for_selector("text=UMAP map of", timeout=150_000)
    page.wait_for_timeout(1500)
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
    images = page.locator("[data-testid='stImage'] img")
    wait_for(lambda: images.count() > 0, 20, "the selected rollouts' images")
    assert images.first.evaluate("img => img.complete && img.naturalWidth > 0")
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
    assert page.locator("[data-testid='stImage'] img").count() >= 1
    page.screenshot(path=str(SCREENSHOTS / "rollouts.png"))
    for name, path, marker in (("runs", "", "Time to a target accuracy"),
                               ("demo", "demo", "Speed and accuracy against GRPO")):
        page.goto(f"{url}/{path}")
        page.wait_for_selector(f"text={marker}")
        page.wait_for_selector(".js-plotly-plot")
        page.wait_for_timeout(1500)
        assert page.locator("[data-testid='stException']").count() == 0, name
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
