"""The pure algorithm modules must not pull in the store, the app, transformers or vLLM."""

import pkgutil
import subprocess
import sys

import pytest

import fastrl_core.algo

CORE = sorted(module.name for module in pkgutil.iter_modules(fastrl_core.algo.__path__))  # every module of algo/
FORBIDDEN = ["transformers", "vllm", "duckdb", "pyarrow", "streamlit", "fastrl_core.store", "fastrl_app"]


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_nothing_heavy(module):
    code = (
        f"import sys, fastrl_core.algo.{module}\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"fastrl_core.algo.{module} imported {out.stdout.strip()}"


def _imported_modules(path, modules: set[str]) -> set[str]:
    """fastrl_core modules a file imports anywhere (module level or inside functions), except type-only imports
    under `if TYPE_CHECKING:`; `from package import name` counts as importing package.name when that is a module."""
    import ast

    tree = ast.parse(path.read_text())
    type_only = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test) for sub in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
    return found & modules


def test_no_two_core_modules_import_each_other():
    """The layers flow one way: no fastrl_core module imports a module that imports it back (registration happens
    in one place, algo.pruners; config.py reads its checks from checks.py, never the reverse)."""
    from pathlib import Path

    root = Path(fastrl_core.algo.__file__).resolve().parent.parent
    files = {".".join(("fastrl_core", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}
    imports = {name: _imported_modules(path, set(files)) - {name} for name, path in files.items()}
    loops = sorted((a, b) for a in imports for b in imports[a] if a < b and a in imports[b])
    assert not loops, f"modules importing each other: {loops}"
