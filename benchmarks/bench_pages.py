"""Load time of every dashboard page in headless Chromium, on a store a real run wrote (e.g. `fastrl demo`'s).

    .venv/bin/python benchmarks/bench_pages.py --store runs               # serves the store itself
    .venv/bin/python benchmarks/bench_pages.py --url http://127.0.0.1:8501  # an app already serving
    .venv/bin/python benchmarks/bench_pages.py --store runs --launch-pairs 3  # and app starts, two ways

A page's time runs from `goto` until the user sees the whole page: its first script run has ended (the app root's
script state), no element is still a loading placeholder (Streamlit's skeleton), and every Plotly chart is drawn
(`READY`, polled every animation frame). Until 2026-12-06 it ran until Playwright's "networkidle" instead, which
waits for 500 ms without a request by definition, so every figure carried half a second of waiting; and it did
not wait for the placeholders, which can outlast it. Each page is loaded `--repeats` times in a fresh browser
context (nothing cached: a first visit) and the median and range are printed. `bench_app.py` times
the same pages without a browser (AppTest) on a large synthetic store. Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

PAGES = ("runs", "budget", "rollouts", "embeddings", "demo")
CHROMIUM = "/usr/bin/chromium"
# Ready: the app root's script state is "initial" until the page's first script run, "running", then "notRunning"
# once it has ended (waiting for the status widget to be absent ended too early: on a cold app it had not appeared
# yet); then no skeleton placeholder is left and every Plotly chart has its SVG.
READY = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.dataset.testScriptState !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  return [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('.main-svg'));
}"""


def time_page(browser, url: str) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.set_default_timeout(120_000)
    try:
        start = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("[data-testid='stMainBlockContainer']")
        page.wait_for_function(READY)
        seconds = time.perf_counter() - start
        page.wait_for_load_state("networkidle")  # not counted: lets the page settle before the tab closes
        return seconds
    finally:
        page.close()


def floor_times(browser, repeats: int, port: int) -> tuple[float, list[float]]:
    """(cold, warm loads) of `floor_page.py` (a title and one small Plotly chart) served fresh by plain `streamlit
    run` with the app's options: what any page with a chart costs on this machine and browser."""
    from fastrl_app.launch import serve

    server = serve(Path.cwd(), port=port, timeout=120, entry=Path(__file__).with_name("floor_page.py"),
                   server="streamlit")
    try:
        cold, *warm = [time_page(browser, f"http://127.0.0.1:{port}/") for _ in range(1 + repeats)]
        return cold, warm
    finally:
        server.terminate()
        server.wait(30)


def launch_pairs(browser, store: Path, pairs: int, port: int, url_path: str = "budget") -> None:
    """Start the app `pairs` times each way, interleaved: plain `streamlit run` (the pages' imports happen in the
    first page opened) and `fastrl_app.server` (what `fastrl app` runs: imported while the server starts); print
    the time until it answers its health check and the first load of `url_path`, then one more load."""
    from fastrl_app.launch import SERVER, serve

    print(f"app start and first page ({url_path}) after it, plain streamlit vs {SERVER}, interleaved (s)")
    for _ in range(pairs):
        for name, server in (("streamlit run", "streamlit"), (SERVER, SERVER)):
            start = time.perf_counter()
            app = serve(store, port=port, timeout=120, server=server)
            up = time.perf_counter() - start
            try:
                first, again = (time_page(browser, f"http://127.0.0.1:{port}/{url_path}") for _ in range(2))
            finally:
                app.terminate()
                app.wait(30)
            print(f"  {name:<18} start {up:5.2f}  first page {first:5.2f}  again {again:5.2f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="serve this store on --port")
    parser.add_argument("--url", help="an app already serving")
    parser.add_argument("--port", type=int, default=8597)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--launch-pairs", type=int, default=0, metavar="N",
                        help="with --store: also time N app starts each way (launch_pairs)")
    args = parser.parse_args()
    if (args.store is None) == (args.url is None):
        parser.error("give exactly one of --store and --url")
    from playwright.sync_api import sync_playwright

    app = None
    if args.store is not None:
        from fastrl_app.launch import serve

        app = serve(args.store, port=args.port)
    base = args.url or f"http://127.0.0.1:{args.port}"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            time_page(browser, f"{base}/runs")  # warm-up: the app process's imports
            print(f"page load in headless Chromium until drawn, {args.repeats} loads each (s): median [min, max]")
            for name in PAGES:
                seconds = [time_page(browser, f"{base}/{name}") for _ in range(args.repeats)]
                print(f"  {name:<11} {statistics.median(seconds):5.2f} [{min(seconds):.2f}, {max(seconds):.2f}]")
            _, floor = floor_times(browser, args.repeats, args.port + 1)
            print(f"  {'floor':<11} {statistics.median(floor):5.2f} [{min(floor):.2f}, {max(floor):.2f}]  "
                  "(benchmarks/floor_page.py: a title and one small Plotly chart)")
            if args.launch_pairs and app is not None:
                app.terminate()
                app.wait(30)
                app = None
                launch_pairs(browser, args.store, args.launch_pairs, args.port)
            browser.close()
    finally:
        if app is not None:
            app.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
