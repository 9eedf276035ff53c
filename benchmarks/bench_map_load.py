"""Seconds to load the Embeddings page with its map drawn, at a real run's size: a direct load of
/embeddings?run=<a FastRL run>&steps=<range> in headless Chromium, timed until the UMAP map is drawn
(bench_pages.READY), `--repeats` times per step range after one untimed load that waits for the background UMAP fit.

    .venv/bin/python benchmarks/bench_store_scale.py --store /tmp/scale --no-pages   # the 800-step store (once)
    .venv/bin/python benchmarks/bench_map_load.py --store /tmp/scale                  # 2,560 and 8,192 points

The default ranges are the page's default (the last 5 steps: 2,560 points) and the most it maps (16 steps: 8,192).
Run on a quiet machine; compare two versions of the app in the same hour (serve the other one through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pages import CHROMIUM, READY  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8596)
    parser.add_argument("--ranges", default="795-799,784-799", help="step ranges, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the UMAP map")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from fastrl_app.launch import serve
    from fastrl_core import store

    runs = [r for r in store.layout.list_runs(args.store) if "fastrl" in r]
    if not runs:
        raise SystemExit(f"bench_map_load: no FastRL run in {args.store}")
    app = serve(args.store, port=args.port, timeout=120)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            for steps in args.ranges.split(","):
                url = f"http://127.0.0.1:{args.port}/embeddings?run={runs[0]}&steps={steps}"

                def load() -> float:
                    start = time.perf_counter()
                    page.goto(url)
                    page.wait_for_selector("text=UMAP map of", timeout=args.timeout * 1000)
                    page.wait_for_function(READY, timeout=args.timeout * 1000)
                    return time.perf_counter() - start

                load()  # untimed: waits for the background UMAP fit of these steps
                seconds = [load() for _ in range(args.repeats)]
                print(f"steps {steps}: " + " ".join(f"{s:.2f}" for s in seconds), flush=True)
            browser.close()
    finally:
        app.terminate()
        app.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
