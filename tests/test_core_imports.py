"""The house's imports: the pure algorithm pulls in nothing heavy, the library (`fastrl_core`) never imports the layer
above it (`fastrl_app`, the checkout's `app/`), no modules import each other in a circle, and every name is imported
from the module that defines it. Every import counts: module level, inside functions and under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastrl_core.algo

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"fastrl_core": REPO / "fastrl_core", "fastrl_app": REPO / "app"}  # import name -> folder
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


def project_modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its `__init__.py`)."""
    out = {}
    for name, root in packages.items():
        for path in sorted(root.rglob("*.py")):
            out[".".join((name, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")] = path
    return out


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module imported, name taken or "", line) for every import of a project module anywhere in the file: module
    level, in functions, under TYPE_CHECKING. `from package import name` imports package.name when that is a
    module, else package (taking `name`); relative imports are resolved against `module`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append((f"{base}.{alias.name}", "", node.lineno))
                elif base in modules:
                    found.append((base, alias.name, node.lineno))
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or one that imports itself (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(out)


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    modules = project_modules(packages)
    return {name: {imported for imported, _, _ in imports_of(name, path, modules)} for name, path in modules.items()}


def test_no_circle_of_imports_counting_type_checking_and_function_level_ones():
    found = circles(import_graph(PACKAGES))
    assert not found, f"modules that import each other in a circle: {found}"


def test_the_circle_finder_sees_type_checking_and_function_level_imports(tmp_path):
    """A circle closed only by a TYPE_CHECKING import, and one closed only inside a function, are both found."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg.b import B\n")
    (root / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nB = 1\n")
    (root / "c.py").write_text("import pkg.d\n")
    (root / "d.py").write_text("def f():\n    from pkg import c\n")
    (root / "e.py").write_text("from . import a\n")
    assert circles(import_graph({"pkg": root})) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]


def test_the_library_never_imports_the_layer_above():
    modules = project_modules(PACKAGES)
    upward = [f"{PACKAGES['fastrl_core'].name}/{path.relative_to(PACKAGES['fastrl_core'])}:{line} imports {imported}"
              for name, path in modules.items() if name.startswith("fastrl_core")
              for imported, _, line in imports_of(name, path, modules) if imported.startswith("fastrl_app")]
    text = "\n".join(path.read_text() for name, path in modules.items() if name.startswith("fastrl_core"))
    assert not upward and "import app" not in text and "from app" not in text, upward


def _defines(path: Path) -> set[str]:
    """Names a module binds at its top level (functions, classes, assignments, loop targets, its own imports of
    project submodules do not count: those are imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _public_face(path: Path) -> set[str]:
    """A package `__init__`'s `__all__`: the names it hands on as the package's interface (the store's)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_every_name_is_imported_from_the_module_that_defines_it():
    """No "importable from here too": a name comes from its own module (or from a package's declared face,
    `__all__` of an `__init__.py`), so moving a definition never leaves an alias behind."""
    modules = project_modules(PACKAGES)
    files = [*modules.values(), *sorted((REPO / "tests").glob("*.py")), *sorted((REPO / "scripts").glob("*.py")),
             *sorted((REPO / "benchmarks").glob("*.py"))]
    names = {name: _defines(path) | (_public_face(path) if path.name == "__init__.py" else set())
             for name, path in modules.items()}
    wrong = []
    for path in files:
        module = next((name for name, p in modules.items() if p == path), path.stem)
        for imported, taken, line in imports_of(module, path, modules):
            if taken and taken not in names[imported]:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {taken} from {imported}")
    assert not wrong, "names imported from a module that does not define them:\n" + "\n".join(wrong)


# import name -> distribution, where they differ
DISTRIBUTIONS = {"PIL": "pillow", "yaml": "pyyaml", "math_verify": "math-verify", "umap": "umap-learn",
                 "markdown_it": "markdown-it-py"}
# modules whose own extra declares what they import at module level (the rest of the package needs the core's)
EXTRA_OF = {"fastrl_core.integrations.trl": "trl"}


def _declared() -> dict[str, set[str]]:
    """pyproject.toml: "core" and each extra -> the distribution names it declares."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda requirement: re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()  # noqa: E731
    return {"core": {name(r) for r in project["dependencies"]},
            **{extra: {name(r) for r in rs} for extra, rs in project["optional-dependencies"].items()}}


def test_every_module_level_import_is_declared_where_the_module_ships():
    """A third-party package a module imports at load is declared by the core's dependencies (fastrl_core) or by the
    core's and the `app` extra (fastrl_app), or by the module's own extra (`EXTRA_OF`). Imports inside functions are
    optional engines (vLLM, TRL) that say how to install themselves."""
    declared = _declared()
    missing = []
    for module, path in project_modules(PACKAGES).items():
        extras = ["core"] + (["app"] if module.startswith("fastrl_app") else []) + [EXTRA_OF.get(module, "core")]
        allowed = set().union(*(declared[extra] for extra in extras))
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"__future__", *PACKAGES}:
                if DISTRIBUTIONS.get(top, top).lower() not in allowed:
                    missing.append(f"{module}: {top} (declared by none of {extras})")
    assert not missing, "\n".join(missing)
