"""The command line: eval into the store and `fastrl demo` (the README's main job) end to end.

`fastrl bench` is tested in tests/test_bench.py."""

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fastrl_core import store
from fastrl_core.cli import main

REPO = Path(__file__).resolve().parent.parent
REAL = REPO.parent / "shared" / "data" / "geo-real-sample"


@pytest.mark.skipif(not REAL.exists(), reason="../shared/data/geo-real-sample is absent")
def test_eval_on_real_problems_writes_the_store(tmp_path, capsys):
    assert main(["eval", "--dataset", str(REAL), "--limit", "6", "--store", str(tmp_path), "--batch-size", "6"]) == 0
    assert "accuracy" in capsys.readouterr().out
    runs = store.read_runs(tmp_path)
    evals = store.read_evals(tmp_path, runs["run_id"].tolist())
    assert evals["n"].tolist() == [6] and 0.0 <= evals["accuracy"].iloc[0] <= 1.0


def test_train_rejects_an_unknown_key_with_the_valid_names():
    with pytest.raises(KeyError, match="unknown config key 'stepz'; valid keys"):
        main(["train", str(REPO / "configs" / "embedded.yaml"), "stepz=3"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_demo_trains_both_runs_serves_the_app_and_stops_cleanly(tmp_path):
    port = _free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "fastrl_core.cli", "demo", "--store", str(tmp_path), "--port", str(port),
         "--steps", "3"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            runs = store.read_runs(tmp_path) if (tmp_path / "runs").exists() else None
            if runs is not None and len(runs) == 2 and (runs["status"] == "finished").all():
                break
            assert demo.poll() is None, demo.stdout.read()
            time.sleep(1)
        else:
            pytest.fail("the demo's two runs did not finish in time")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as response:
            assert response.read().strip() == b"ok"
        assert sorted(runs["pruner"]) == ["fastrl", "none"]
    finally:
        demo.send_signal(signal.SIGTERM)  # like a container stop; Ctrl-C (SIGINT) takes the same path
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    assert f"http://127.0.0.1:{port}" in output
    deadline = time.monotonic() + 15  # the app server goes down with the demo
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
        except OSError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the app server outlived the demo")
