"""A user's own data through `fastrl train`, as issue 53 asks a fresh checkout to show: a JPEG folder dataset trains,
and each bad input is refused in one line with exit 2 (or, for the 1x4000 image, refused or trained) with no
traceback.

    .venv/bin/python scripts/check_user_data.py

Writes a problems.jsonl + images/ folder per case into a temporary directory (HOME there too: no cache is touched),
runs `fastrl train embedded dataset=<folder> ...` (one short step) or `fastrl train --resume <run>` in a subprocess,
and prints each case's command, exit code and last stderr line. Exit 1 when a case does not behave as stated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_user_data import _diagram  # noqa: E402  (the tests' diagram: a white image with one black line)

FASTRL = str(Path(sys.executable).with_name("fastrl"))
SHORT = ["steps=1", "prompts_per_step=4", "rollouts_per_prompt=2", "eval_every=0", "checkpoint_every=0",
         "max_new_tokens=8", "threads=1"]


def _dataset(folder: Path, edit=lambda row: row) -> Path:
    """Six JPEG problems (ids p0..p5, answer 3) and a 1x4000 PNG no row uses; `edit` rewrites row 3's JSON bytes."""
    (folder / "images").mkdir(parents=True)
    for i in range(6):
        _diagram(size=(56 + 8 * i, 56)).save(folder / "images" / f"{i}.jpg", quality=90)
    _diagram(size=(1, 4000)).save(folder / "images" / "thin.png")
    rows = [json.dumps({"id": f"p{i}", "question": "How many lines?", "answer": "3",
                        "image": f"images/{i}.jpg"}).encode() for i in range(6)]
    rows[3] = edit(rows[3])
    (folder / "problems.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    return folder


def _run(root: Path, *args: str) -> tuple[int, str]:
    command = [FASTRL, "train", *args]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HOME": str(root / "home")})
    print("$ fastrl train " + " ".join(a.replace(str(root), "$TMP") for a in args))
    last = (done.stderr.strip().splitlines() or [""])[-1]
    print(f"  exit {done.returncode}: {last.replace(str(root), '$TMP')}")
    if "Traceback" in done.stderr:
        print("  a traceback was printed")
        return -1, last
    return done.returncode, last


def main() -> int:
    from fastrl_core.store import list_runs, read_image, read_rollouts, read_steps

    failures = []
    with tempfile.TemporaryDirectory(prefix="fastrl-user-data-") as tmp:
        root = Path(tmp)
        (root / "home").mkdir()
        store = root / "store"

        code, _ = _run(root, "embedded", f"dataset={_dataset(root / 'jpeg')}", f"store_dir={store}", *SHORT)
        (run_id,) = list_runs(store)
        steps, rollouts = read_steps(store, run_id), read_rollouts(store, run_id, columns=["image_ref"])
        pngs = {ref: read_image(store, run_id, ref).startswith(b"\x89PNG") for ref in set(rollouts["image_ref"])}
        print(f"  {len(steps)} step, {len(rollouts)} rollouts over {len(pngs)} images, "
              f"all stored as PNG: {all(pngs.values())}")
        if code != 0 or len(steps) != 1 or not all(pngs.values()):
            failures.append("a JPEG dataset did not train")

        bad = {"300,000-character question": lambda row: row.replace(b"How many lines?", b"x" * 300_000),
               "non-UTF-8 byte": lambda row: row.replace(b"How many", b"How \xff many"),
               "1x4000 image": lambda row: row.replace(b"images/3.jpg", b"images/thin.png")}
        for name, edit in bad.items():
            folder = _dataset(root / name.replace(" ", "-").replace(",", ""), edit)
            code, line = _run(root, "embedded", f"dataset={folder}", f"store_dir={root / 'refused'}", *SHORT)
            if code != 2 or not line.startswith("fastrl: error: ") or (root / "refused").exists():
                failures.append(f"{name}: exit {code}, not one line with exit 2 before the store")

        (store / "runs" / run_id / "run.json").write_text('{"config": {')
        code, line = _run(root, "--resume", run_id, f"store_dir={store}")
        if code != 2 or not line.startswith("fastrl: error: "):
            failures.append(f"damaged run.json: exit {code}, not one line with exit 2")
    for failure in failures:
        print("FAILED:", failure)
    print("all cases behave as stated" if not failures else f"{len(failures)} case(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
