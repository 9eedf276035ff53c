"""End to end on what `fastrl demo` does: the real command (tiny steps) trains FastRL and GRPO interleaved in one
process while it serves the dashboard, and headless Chromium checks every page on the store it wrote, live and
after the runs, and the offline HTML report. Saves screenshots (to $FASTRL_SCREENSHOTS, e.g. docs/screenshots,
else a temp folder) and prints each page's load time (to judge on a quiet machine only).

No wall-clock deadline a slow machine could miss: training is awaited by reading the demo's own output until it
says both runs finished (or exits), and the live check compares what the page showed during training with what it
shows after, without reloading it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from test_app_browser import CHROMIUM, READY, free_port
from test_app_pages import REPO

from fastrl_app import palette
from fastrl_core import store

SCREENSHOTS = Path(os.environ.get("FASTRL_SCREENSHOTS") or tempfile.mkdtemp(prefix="fastrl-screenshots-"))
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent (apt-get install chromium; `make test` does)")]
# A short demo: the demo config's regime (KL pass, 4 PPO updates, a pool revisited: 16 prompts, 8 a step, so every
# prompt comes back every other step) at toy sizes, one thread.
TINY = ["steps=10", "prompts_per_step=8", "synthetic_train=16", "synthetic_test=32", "eval_every=4", "eval_size=32",
        "eval_samples=2", "threads=1"]
LOAD_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`fastrl demo` on a fresh store, its output read line by line; yields (store, url, process, lines read up to
    the first step) and stops it at teardown."""
    store_dir = tmp_path_factory.mktemp("demo_store")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "fastrl_app.cli", "demo", "--store", str(store_dir), "--port",
                                str(port), *TINY], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    for line in process.stdout:  # the app is healthy before training starts; wait for the first steps row
        lines.append(line)
        if "demo (both runs)" in line and "kept" in line or "FastRL dashboard" in line:
            break
    while not any(store.latest_step(store_dir, r) is not None for r in _run_ids(store_dir)):
        assert process.poll() is None, "".join(lines)
        time.sleep(0.5)
    try:
        yield store_dir, f"http://127.0.0.1:{port}", process, lines
    finally:
        process.terminate()
        process.wait(60)
        process.stdout.close()


def _run_ids(store_dir: Path) -> list[str]:
    return store.read_runs(store_dir)["run_id"].tolist() if (store_dir / "runs").exists() else []


def finished(demo) -> list[str]:
    """Read the demo's output until it says both runs finished; returns everything it printed."""
    store_dir, _, process, lines = demo
    if not any("Both runs finished" in line for line in lines):
        for line in process.stdout:
            lines.extend(line.split("\r"))
            if "Both runs finished" in line:
                break
    assert any("Both runs finished" in line for line in lines), "".join(lines)[-3000:]
    return lines


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture()
def page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
    page.set_default_timeout(180_000)
    yield page
    page.close()


def load(page, url: str, marker: str, name: str) -> None:
    """Open `url`, wait for `marker` and for the page to be drawn (bench_pages.READY: script run ended, no
    placeholder left, every Plotly chart drawn; "networkidle" alone came before the last charts); records the load
    time."""
    start = time.perf_counter()
    page.goto(url)
    page.wait_for_selector(f"text={marker}")
    page.wait_for_function(READY)
    page.wait_for_load_state("networkidle")
    LOAD_TIMES[name] = time.perf_counter() - start
    assert page.locator("[data-testid='stException']").count() == 0, name


def plot_traces(page) -> list[dict]:
    """Every Plotly trace on the page: name, x values and colour."""
    return page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(el => (el._fullData || [])
        .map(t => ({name: t.name || '', type: t.type, x: Array.from(t.x || []), y: Array.from(t.y || []),
                    colour: (t.line && t.line.color) || (t.marker && typeof t.marker.color === 'string' ?
                             t.marker.color : null)})))""")


def run_id_of(store_dir: Path, method: str) -> str:
    runs = store.read_runs(store_dir)
    return runs.loc[runs["name"] == f"bench-{method}-seed0", "run_id"].iloc[0]


def test_demo_page_live_then_after_the_runs(demo, page):
    store_dir, url, _, _ = demo
    load(page, f"{url}/demo", "Where the rollouts went", "demo (live)")
    page.wait_for_selector(".js-plotly-plot")
    page.evaluate("window.__no_reload_marker = 7")
    budget_during = max((len(t["x"]) for t in plot_traces(page) if t["name"] in ("fastrl", "grpo")), default=0)
    still_training = (store.read_runs(store_dir)["status"] == "running").any()
    lines = finished(demo)
    assert sum("demo (both runs)" in line for line in lines) >= 1  # one progress display for both runs
    runs = store.read_runs(store_dir)
    assert sorted(runs["name"]) == ["bench-fastrl-seed0", "bench-grpo-seed0"]
    assert set(runs["status"]) == {"finished"}
    page.wait_for_selector("text=Speed-up per step", timeout=300_000)  # the fragment redraws itself
    page.wait_for_selector("text=interleaved step by step in one process")
    assert page.evaluate("window.__no_reload_marker") == 7, "the page was reloaded"
    # the fragment may first redraw from a data cache one step behind; it catches up on its next refresh
    page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')].some(el => (el._fullData || [])
        .some(t => (t.name === 'fastrl' || t.name === 'grpo') && (t.x || []).length === 10))""", timeout=120_000)
    traces = plot_traces(page)
    budget_after = max(len(t["x"]) for t in traces if t["name"] in ("fastrl", "grpo"))
    assert budget_after == 10
    if still_training:  # the budget curve moved while the page was open, without a reload
        assert budget_after > budget_during
    else:  # a machine fast enough to finish 10 tiny steps before the page drew: nothing left to watch move
        warnings.warn("the short demo finished before the Demo page was drawn; the live update was not observed")
    colours = {t["name"]: t["colour"] for t in traces if t["name"] in ("fastrl", "grpo")}
    assert colours == {"fastrl": palette.FASTRL, "grpo": palette.GRPO}
    text = page.inner_text("body")
    assert "(n=1)" in text and "one seed, so no interval" in text
    assert "skipped by the budget" in text and "credited to neither" in text and "pruned by the method's rule" in text
    assert "reference log-prob pass" in text and "old log-prob pass" not in text  # beta > 0, no old pass ran
    page.screenshot(path=str(SCREENSHOTS / "demo.png"), full_page=True)


def test_report_button_writes_a_file_that_opens_offline(demo, page, browser, tmp_path):
    finished(demo)
    _, url, _, _ = demo
    load(page, f"{url}/demo", "Hand it over", "demo")
    page.get_by_role("button", name="Prepare the HTML report").click()
    with page.expect_download() as download:
        page.get_by_role("button", name="Download demo.html").click()
    path = tmp_path / "demo.html"
    download.value.save_as(path)
    offline = browser.new_context(offline=True).new_page()
    requests = []
    offline.on("request", lambda r: requests.append(r.url))
    offline.goto(path.as_uri())
    offline.wait_for_selector(".js-plotly-plot .main-svg")
    assert offline.locator(".js-plotly-plot").count() >= 3
    assert offline.locator("img").first.evaluate("img => img.complete && img.naturalWidth > 0")
    assert [r for r in requests if not r.startswith(("file:", "data:"))] == []
    body = offline.inner_text("body")
    assert "Caveats" in body and "credited to neither" in body
    offline.close()


def test_budget_page_tabs_split_timeline_and_whole_run_heatmap(demo, page):
    finished(demo)
    store_dir, url, _, _ = demo
    run_id = run_id_of(store_dir, "fastrl")
    load(page, f"{url}/budget?run={run_id}", "Where plain GRPO's rollouts went", "budget")
    names = {t["name"] for t in plot_traces(page)}
    assert {"skipped by the budget", "merged as duplicates (every method)", "pruned by the method's rule"} <= names
    assert not any(t["type"] == "heatmap" for t in plot_traces(page))  # a closed tab is not built
    page.screenshot(path=str(SCREENSHOTS / "budget.png"), full_page=True)

    page.get_by_role("tab", name="One prompt").click()
    page.wait_for_selector("text=One prompt's visits")
    page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .some(el => (el._fullData || []).some(t => (t.name || '').startsWith('sampled · ')))""")  # the decisions
    page.get_by_role("tab", name="Whole run").click()
    page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .some(el => (el._fullData || []).some(t => t.type === 'heatmap'))""")
    heatmap = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(el => el._fullData)
        .filter(t => t.type === 'heatmap').map(t => ({x: Array.from(t.x), y: Array.from(t.y)}))""")[0]
    assert heatmap["x"] == list(range(10)) and len(heatmap["y"]) == 16
    assert all(label.startswith("synthetic_train_") for label in heatmap["y"])
    assert "view=Whole" in page.url  # the open tab is in the link


def test_rollouts_page_links_side_by_side_and_full_text(demo, page):
    finished(demo)
    store_dir, url, _, _ = demo
    load(page, f"{url}/rollouts?run=nosuchrun&step=999", "which is not in this store", "rollouts (bad link)")
    assert "does not have" in page.inner_text("body")
    run_id = run_id_of(store_dir, "fastrl")
    groups = store.read_groups(store_dir, run_id, step=4)
    prompt = groups.loc[groups["sampled"] > 0, "prompt_id"].iloc[0]
    load(page, f"{url}/rollouts?run={run_id}&step=4&prompt={prompt}", "The same prompt in", "rollouts")
    text = page.inner_text("body")
    assert "stands for" in text and "weight" in text and "score" in text
    assert "bench-grpo" in text and "Token by token" in text
    page.get_by_text("The same prompt in").first.click()  # opens the paired run's group beside this one
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stDataFrame\"]').length >= 3")
    page.wait_for_selector("[data-testid='stText']")  # the full completion, plain
    page.wait_for_selector("span[title^='log-prob']")
    shaded = page.locator("span[title^='log-prob']")  # the token view: one span per token, log-prob on hover
    assert shaded.count() >= 1 and "advantage" in page.locator("text=/^advantage [+-]/").first.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "rollouts.png"), full_page=True)


def test_runs_and_embeddings_pages(demo, page):
    finished(demo)
    store_dir, url, _, _ = demo
    load(page, f"{url}/runs", "Mean of the seeds", "runs")  # the first tab: the methods across seeds
    page.wait_for_selector(".js-plotly-plot")
    colours = {t["name"]: t["colour"] for t in plot_traces(page) if t["name"] in ("fastrl (1 seed)", "grpo (1 seed)")}
    assert colours == {"fastrl (1 seed)": palette.FASTRL, "grpo (1 seed)": palette.GRPO}
    page.screenshot(path=str(SCREENSHOTS / "runs.png"), full_page=True)
    page.get_by_role("tab", name="Where rollouts went").click()  # built when opened; the link names it
    page.wait_for_selector("text=Where each run's rollouts went")
    page.wait_for_function(READY)
    assert "view=Where" in page.url and page.locator("[data-testid='stException']").count() == 0
    load(page, f"{url}/embeddings?run={run_id_of(store_dir, 'grpo')}", "is plain GRPO",
         "embeddings (GRPO run)")
    load(page, f"{url}/embeddings?run={run_id_of(store_dir, 'fastrl')}", "map of", "embeddings")
    page.wait_for_selector("text=UMAP map of", timeout=900_000)  # PCA first; redrawn once the background fit is done
    page.wait_for_function(READY)  # the redrawn map, before dragging on it
    drag = page.locator(".js-plotly-plot .nsewdrag").first
    box = drag.bounding_box()
    page.mouse.move(box["x"] + 2, box["y"] + 2)
    page.mouse.down()
    for i in range(1, 11):
        page.mouse.move(box["x"] + 2 + (box["width"] - 4) * i / 10, box["y"] + 2 + (box["height"] - 4) * i / 10)
    page.mouse.up()
    page.wait_for_selector("text=selected rollouts")
    page.wait_for_selector("text=Page (of")  # more than a page selected: paged
    page.wait_for_selector("text=/Rows 1–12 of \\d+/")  # the table's first page (drawn after the pager)
    page.screenshot(path=str(SCREENSHOTS / "embeddings.png"), full_page=True)


def test_zz_print_load_times():
    print("\npage load times (s; this machine, as loaded as it was):",
          ", ".join(f"{name} {seconds:.1f}" for name, seconds in LOAD_TIMES.items()))
