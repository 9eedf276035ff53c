"""README and docs/: README stays short, every relative link resolves, and nothing cites notes outside the repo."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP = {"build", "dist", "bench", "__pycache__", "node_modules", "runs"}  # folders of outputs and bench data
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")  # a Markdown link's target, without its anchor


def test_readme_is_at_most_250_lines_and_starts_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first_section = next(line for line in lines if line.startswith("## "))
    assert first_section == "## Two commands"
    assert any("make demo" in line for line in lines[:15]) and any("make test" in line for line in lines[:15])


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target, _ in LINK.findall(page.read_text()):
            if not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def _sources() -> list[Path]:
    """The project's own text files: code, configs and docs (no virtual environment, build output or bench data)."""
    import os

    found = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in SKIP
                         and not name.endswith(".egg-info")]
        found += [Path(folder) / name for name in files
                  if name.endswith((".py", ".md", ".yaml", ".toml")) or name in ("Makefile", "Dockerfile")]
    return [path for path in found if path != Path(__file__).resolve()]


def test_no_file_cites_the_notes_outside_the_repository():
    """Facts the code cites live in docs/notes.md (`docs/notes.md §n`), not in a notes file beside the checkout."""
    texts = {path: path.read_text(errors="replace") for path in _sources()}
    found = [f"{path.relative_to(REPO)}" for path, text in texts.items() if re.search(r"NOTES( §|:)|shared/NOTES", text)]
    assert not found, found
    cited = {n for text in texts.values() for n in re.findall(r"docs/notes\.md §(\d+)", text)}
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs" / "notes.md").read_text(), re.M))
    assert cited and cited <= sections, cited - sections
