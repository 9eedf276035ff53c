"""The first hour with the command line (issue 53): a taken port, --help, a closed pipe, a misspelt key and a
stopped demo each end in a line that says what happened and what to do."""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fastrl_app.cli import build_parser
from fastrl_core import store
from fastrl_core.config import ConfigError, read_config
from fastrl_core.resume import resume_command

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastrl_app.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kwargs)


class _Healthy(http.server.BaseHTTPRequestHandler):
    """Another process's server on the port, answering Streamlit's health check as a dashboard would."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("command", ["app", "demo"])
def test_a_taken_port_is_one_line_naming_it_with_exit_2(tmp_path, command):
    other = http.server.HTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_port
    try:
        done = _cli(command, "--store", str(tmp_path / "store"), "--port", str(port))
    finally:
        other.shutdown()
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # no address printed: it would show the other process's page
    assert done.stderr.splitlines() == [f"fastrl: error: port {port} on 127.0.0.1 is already in use by another "
                                        "process (another dashboard?); stop it or pick a free port with --port"]


def test_a_demo_override_the_config_check_refuses_is_one_line_with_exit_2(tmp_path):
    done = _cli("demo", "--store", str(tmp_path), "eval_every=0")  # the demo config records mean@k: needs evaluations
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [
        "fastrl: error: method 'fastrl' (pruner=fastrl budget=adaptive keep_ratio=1.0 row_cost=measured): command "
        "line: eval_samples=4 needs eval_every >= 1: with eval_every=0 the run is never evaluated"]


def _commands(parser: argparse.ArgumentParser, prefix: str = "fastrl") -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command's parser by its command line, `fastrl store check` included."""
    found = {prefix: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_commands(sub, f"{prefix} {name}"))
    return found


def test_every_option_of_every_command_has_its_help():
    commands = _commands(build_parser())
    assert {"fastrl app", "fastrl demo", "fastrl eval", "fastrl store check"} <= set(commands)
    bare = [f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
            for name, parser in commands.items() for action in parser._actions
            if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()]
    assert bare == []
    shown = _cli("app", "--help").stdout
    assert "port the dashboard serves on" in shown and "store directory the dashboard reads" in shown


def test_output_cut_short_by_its_reader_ends_without_a_traceback():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line (`| head` that has read enough)
    try:
        done = subprocess.run([sys.executable, "-m", "fastrl_app.cli", "train", "--list-keys"], cwd=REPO,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode == 141  # as a shell tool killed by SIGPIPE


def test_a_misspelt_key_names_the_nearest_and_a_far_one_lists_the_valid_keys():
    with pytest.raises(ConfigError) as error:
        read_config(None, ["stepz=3"])
    assert str(error.value).startswith("command line: unknown config key 'stepz'; did you mean 'steps'? valid keys: "
                                       "accuracy_weight, ")
    with pytest.raises(ConfigError) as error:
        read_config(None, ["xyzzy=1"])
    assert str(error.value).startswith("command line: unknown config key 'xyzzy'; valid keys: ")


@pytest.mark.slow
def test_stopping_the_demo_names_each_run_and_how_to_resume_it(tmp_path):
    """Ctrl-C while the demo trains: both runs marked stopped, each named with the command that continues it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = subprocess.Popen(
        [sys.executable, "-m", "fastrl_app.cli", "demo", "--store", str(tmp_path), "--port", str(port),
         "--steps", "1000", "synthetic_train=16", "synthetic_test=8", "eval_size=8", "eval_every=1000",
         "prompts_per_step=4", "threads=1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and demo.poll() is None:
            runs = store.read_runs(tmp_path) if (tmp_path / "runs").exists() else None
            if runs is not None and len(runs) == 2 and all(
                    store.latest_step(tmp_path, r) is not None for r in runs["run_id"]):
                break
            time.sleep(1)
        demo.send_signal(signal.SIGINT)
        try:  # it marks both runs and stops the dashboard: seconds on a quiet machine, longer on a loaded one
            output, _ = demo.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            demo.kill()
            pytest.fail(f"the demo did not exit within 300 s of Ctrl-C; its output:\n{demo.communicate()[0][-3000:]}")
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, output[-3000:]
    runs = store.read_runs(tmp_path)
    assert len(runs) == 2 and set(runs["status"]) == {"stopped"}, output[-3000:]
    lines = output.splitlines()
    start = lines.index("stopping the dashboard")
    named = lines[start + 1:]
    for run_id, name in zip(runs["run_id"], runs["name"]):
        method = name.split("-")[1]  # bench-<method>-seed0
        assert (f"  run {run_id} ({method}) is marked stopped; `{resume_command(tmp_path, run_id)}` continues it"
                in named), output[-3000:]
