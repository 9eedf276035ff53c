"""The pure algorithm modules must not pull in the store, the app, transformers or vLLM."""

import pkgutil
import subprocess
import sys

import pytest

import fastrl_core.algo

CORE = sorted(module.name for module in pkgutil.iter_modules(fastrl_core.algo.__path__))  # every module of algo/
FORBIDDEN = ["transformers", "vllm", "duckdb", "pyarrow", "streamlit", "fastrl_core.store", "app"]


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_nothing_heavy(module):
    code = (
        f"import sys, fastrl_core.algo.{module}\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"fastrl_core.algo.{module} imported {out.stdout.strip()}"
