"""The command line: eval into the store and `fastrl demo` (the README's main job) end to end.

`fastrl bench` is tested in tests/test_bench.py."""

import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fastrl_app.cli import main
from fastrl_core import store

REPO = Path(__file__).resolve().parent.parent
REAL = REPO.parent / "shared" / "data" / "geo-real-sample"


@pytest.mark.skipif(not REAL.exists(), reason="../shared/data/geo-real-sample is absent")
def test_eval_on_real_problems_writes_the_store(tmp_path, capsys):
    assert main(["eval", "--dataset", str(REAL), "--limit", "6", "--store", str(tmp_path), "--batch-size", "6"]) == 0
    assert "accuracy" in capsys.readouterr().out
    runs = store.read_runs(tmp_path)
    evals = store.read_evals(tmp_path, runs["run_id"].tolist())
    assert evals["n"].tolist() == [6] and 0.0 <= evals["accuracy"].iloc[0] <= 1.0


def test_train_rejects_an_unknown_key_with_the_valid_names(capsys):
    assert main(["train", "embedded", "stepz=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrl: error: command line: unknown config key 'stepz'; did you mean 'steps'? valid keys: "
                          "accuracy_weight")
    assert err.count("\n") == 1


def test_train_method_applies_the_bench_definition_under_the_overrides_given(tmp_path, capsys):
    from fastrl_core.methods import METHODS

    tiny = ["steps=1", "eval_every=0", "prompts_per_step=2", "rollouts_per_prompt=2", "synthetic_train=8",
            "synthetic_test=4", "threads=1", "checkpoint_every=0", f"store_dir={tmp_path}"]
    assert main(["train", "--method", "fastrl", "embedded", *tiny, "keep_ratio=0.9"]) == 0
    config = store.read_runs(tmp_path)["config"].iloc[0]
    config = config if isinstance(config, dict) else __import__("json").loads(config)
    assert "row_cost=measured" in METHODS["fastrl"] and config["row_cost"] == "measured"
    assert config["keep_ratio"] == 0.9  # the command line's override wins over the method's keep_ratio=1.0
    capsys.readouterr()
    after = tmp_path / "after"  # the option may also come after CONFIG.yaml and between overrides
    assert main(["train", "embedded", *tiny[:-1], "--method", "grpo",
                 f"store_dir={after}"]) == 0
    config = store.read_runs(after)["config"].iloc[0]
    config = config if isinstance(config, dict) else __import__("json").loads(config)
    assert config["pruner"] == "none" and config["budget"] == "fixed"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "embedded", "--bogus", "1"])
    assert "unrecognized arguments: --bogus 1" in capsys.readouterr().err
    assert main(["train", "--method", "nope", *tiny]) == 2
    assert "--method 'nope' is unknown; valid: grpo," in capsys.readouterr().err


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastrl_app.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastrl: error: "), result.stderr
    return lines[0]


def test_a_bad_config_name_fails_in_one_line_before_anything_loads(tmp_path):
    from fastrl_core.algo.pruners import PRUNERS

    store_dir = tmp_path / "store"
    line = _one_error_line(_cli("train", "embedded", "pruner=foo", f"store_dir={store_dir}"))
    assert "pruner='foo' is unknown; valid: " + ", ".join(PRUNERS.names()) in line
    assert not store_dir.exists()  # no synthetic data written, no run created: the check ran first
    debug = _cli("train", "embedded", "pruner=foo", f"store_dir={store_dir}", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "ConfigError: command line: pruner=" in debug.stderr


def test_a_bad_dataset_row_or_a_missing_file_fails_in_one_line(tmp_path):
    import json

    sample = REPO / "tests" / "data" / "geometry3k-sample"
    rows = [json.loads(line) for line in (sample / "problems.jsonl").read_text().splitlines()][:20]
    rows[3]["image"] = "images/missing.png"
    dataset = tmp_path / "bad"
    shutil.copytree(sample / "images", dataset / "images")  # a dataset reads only its own folder
    (dataset / "problems.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    store_dir = tmp_path / "store"
    line = _one_error_line(_cli("train", f"dataset={dataset}", f"store_dir={store_dir}", "prompts_per_step=4"))
    assert f"{dataset / 'problems.jsonl'}: row 3 (id {rows[3]['id']!r}): image" in line and "not found" in line
    assert not store_dir.exists()
    assert "config file 'nope.yaml' not found (shipped configs, by name: demo, embedded, paper, paper-wide)" in _one_error_line(
        _cli("train", "nope.yaml"))
    line = _one_error_line(_cli("eval", "--dataset", str(dataset), "--template", "latex", "--store", str(store_dir)))
    assert "--template 'latex' is unknown; valid: math, r1v, short" in line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_demo_trains_both_runs_serves_the_app_and_stops_cleanly(tmp_path):
    port = _free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "fastrl_app.cli", "demo", "--store", str(tmp_path), "--port", str(port),
         "--steps", "3", "synthetic_train=16", "synthetic_test=32", "eval_size=32", "prompts_per_step=8",
         "threads=1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in demo.stdout:  # no wall-clock deadline: the demo says when both runs are done (or exits)
            lines.append(line)
            if "Both runs finished" in line:
                break
        assert any("Both runs finished" in line for line in lines), "".join(lines)[-3000:]
        runs = store.read_runs(tmp_path)
        assert len(runs) == 2 and (runs["status"] == "finished").all()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as response:
            assert response.read().strip() == b"ok"
        assert sorted(runs["pruner"]) == ["fastrl", "none"]
        configs = {name.split("-")[1]: config if isinstance(config, dict) else __import__("json").loads(config)
                   for name, config in zip(runs["name"], runs["config"])}  # bench-<method>-seed0: interleaved
        # the demo trains the bench's FastRL and GRPO (fastrl_app.bench.METHODS), not definitions of its own
        assert (configs["fastrl"]["keep_ratio"], configs["fastrl"]["row_cost"]) == (1.0, "measured")
        assert (configs["grpo"]["pruner"], configs["grpo"]["budget"]) == ("none", "fixed")
    finally:
        demo.send_signal(signal.SIGTERM)  # like a container stop; Ctrl-C (SIGINT) takes the same path
        output, _ = demo.communicate(timeout=60)
    output = "".join(lines) + output
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


def test_eval_skip_bad_on_the_shipped_sample_counts_and_scores_the_good_rows(tmp_path, capsys):
    import json

    sample = REPO / "tests" / "data" / "geometry3k-sample"
    rows = [dict(row, image=str(sample / row["image"]))
            for row in map(json.loads, (sample / "problems.jsonl").read_text().splitlines())][:5]
    rows.insert(2, dict(rows[0], id="broken", image="images/missing.png"))
    dataset = tmp_path / "data"
    dataset.mkdir()
    (dataset / "problems.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = ["eval", "--dataset", str(dataset), "--store", str(tmp_path / "store"), "--batch-size", "5"]
    assert main(args) == 2  # its images lie outside its folder: refused unless asked for
    assert f"row 0 (id {rows[0]['id']!r}): image path '{sample}/images/" in capsys.readouterr().err
    args.append("--allow-outside-paths")
    assert main(args) == 2 and "row 2 (id 'broken')" in capsys.readouterr().err
    assert main([*args, "--skip-bad"]) == 0
    assert "n=5" in capsys.readouterr().out


def test_every_bad_input_of_the_probe_is_one_line_with_exit_2(tmp_path):
    """Issue 46's probe, through the real command: each case one line on stderr, exit 2, no run created."""
    twice, empty = tmp_path / "twice.yaml", tmp_path / "empty.yaml"
    twice.write_text("steps: 3\nlr: 1e-3\nlr: 2e-3\n")
    empty.write_text("")
    one = tmp_path / "one"
    shutil.copytree(REPO / "tests" / "data" / "geometry3k-sample" / "images", one / "images")
    (one / "problems.jsonl").write_text(
        (REPO / "tests" / "data" / "geometry3k-sample" / "problems.jsonl").read_text().splitlines()[0] + "\n")
    store_dir = tmp_path / "store"
    cases = {
        (str(twice),): f"fastrl: error: {twice}: line 3: key 'lr' is given twice (first on line 2); give it once",
        (str(empty),): f"fastrl: error: {empty}: the file is empty (no config keys); give at least one key, or no "
                       "config file for the defaults",
        (str(tmp_path),): f"fastrl: error: config file '{tmp_path}' is a folder; give a YAML file or a shipped "
                          "config's name (demo, embedded, paper, paper-wide)",
        ("steps=1000000000000000",): "fastrl: error: command line: steps=1000000000000000 is out of range: it must "
                                     "be >= 1 and <= 10,000,000",
        (f"dataset={one}", "prompts_per_step=4"): f"fastrl: error: dataset '{one}' split 'train': 1 usable problems, "
                                                  "fewer than prompts_per_step=4 (one step takes that many distinct "
                                                  "problems): lower prompts_per_step or add problems",
    }
    for args, expected in cases.items():
        assert _one_error_line(_cli("train", *args, f"store_dir={store_dir}")) == expected
    assert not (store_dir / "runs").exists()
    assert "--allow-outside-paths" in _cli("eval", "--help").stdout


def test_a_run_name_that_changes_in_the_run_id_says_what_it_became(tmp_path):
    name, kept = "Ünïcødé-运行", "n-c-d"
    assert [store.layout.run_id_base(n) for n in ("a/b", "..", "ok_name-1.2")] == ["a-b", "run", "ok_name-1.2"]
    done = _cli("train", "embedded", f"run_name={name}", f"store_dir={tmp_path}", "steps=1",
                "eval_every=0", "checkpoint_every=0", "prompts_per_step=2", "rollouts_per_prompt=2",
                "synthetic_train=8", "synthetic_test=4", "threads=1")
    assert done.returncode == 0, done.stderr
    (run_id,) = store.list_runs(tmp_path)
    assert run_id.startswith(f"{kept}-")
    lines = [line for line in done.stderr.splitlines() if "became" in line]
    assert lines == [f"run name {name!r} became {kept!r} in the run id {run_id} (run ids keep only ASCII letters, "
                     "digits, '.', '_' and '-', up to 64 of them)"]
    assert store.read_runs(tmp_path).iloc[0]["name"] == name  # the name itself is kept in the record
