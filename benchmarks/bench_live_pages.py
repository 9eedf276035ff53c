"""What an open dashboard page costs while a run trains beside it: how often the page redraws and what share of the
time its script runs (a core the training does not get on a 2-core machine).

    .venv/bin/python benchmarks/bench_live_pages.py [--seconds 20] [--store DIR]

Trains a short GRPO run on the embedded default, starts a FastRL run in the background (the live run), serves the
app on the store, and opens each live page (Budget, Runs, Demo) in headless Chromium. For `--seconds` it samples the
app root's script state every 20 ms and prints the page's script runs: how many, their lengths (median, max) and
the share of the time the page was running. A long run is a redraw of the page; a run of a few milliseconds is the
change check (`widgets.redraw_on_change`). Run on a machine with nothing else running: the training beside it is
the load being measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_pages import CHROMIUM  # noqa: E402

STATE = "() => document.querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState"
REDRAW_S = 0.3  # a script run longer than this is a redraw of the page; a shorter one the change check


def script_runs(page, seconds: float) -> list[float]:
    """Lengths (s) of the page's script runs that ended within `seconds` of sampling its state every 20 ms."""
    runs, last, started, end = [], None, None, time.monotonic() + seconds
    while time.monotonic() < end:
        state, now = page.evaluate(STATE), time.monotonic()
        if state == "running" and last != "running":
            started = now
        elif state != "running" and last == "running" and started is not None:
            runs.append(now - started)
        last = state
        time.sleep(0.02)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds each page is watched")
    parser.add_argument("--store", type=Path, default=None, help="an empty folder for the store (default: a temp one)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright
    from test_app_browser import free_port, live_run_id, start_run, wait_for

    from fastrl_app.launch import serve
    from fastrl_core import store

    store_dir = args.store or Path(tempfile.mkdtemp(prefix="fastrl-live-pages-"))
    store_dir.mkdir(parents=True, exist_ok=True)
    baseline = start_run(store_dir, "grpo", 10)
    if baseline.wait(600) != 0:
        raise SystemExit((store_dir / "grpo.stderr").read_text()[-2000:])
    live = start_run(store_dir, "fastrl", 1000)
    port = free_port()
    app = serve(store_dir, port=port, timeout=120)
    try:
        wait_for(lambda: live_run_id(store_dir) and store.latest_step(store_dir, live_run_id(store_dir)) is not None,
                 300, "the live run's first step")
        first = store.latest_step(store_dir, live_run_id(store_dir))
        print(f"a FastRL run trains beside the app (embedded default); each page watched {args.seconds:.0f} s")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            for name, path in (("budget", f"budget?run={live_run_id(store_dir)}"), ("runs", "runs"),
                               ("demo", "demo")):
                page.goto(f"http://127.0.0.1:{port}/{path}")
                time.sleep(5)  # past the first load
                runs = script_runs(page, args.seconds)
                redraws = [r for r in runs if r > REDRAW_S]
                print(f"  {name:<7} redraws {len(redraws):>2} (median {statistics.median(redraws or [0]):.2f} s, "
                      f"max {max(redraws or [0]):.2f} s), change checks {len(runs) - len(redraws):>2}; the page "
                      f"ran {sum(runs) / args.seconds:.0%} of the time")
            browser.close()
        steps = store.latest_step(store_dir, live_run_id(store_dir)) - first
        print(f"the live run wrote {steps} steps meanwhile ({steps / (3 * (args.seconds + 5)):.2f} a second)")
    finally:
        for process in (live, app):
            process.terminate()
            process.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
