"""README and docs/: README stays short, every relative link resolves, and nothing cites notes outside the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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


def test_no_file_cites_the_notes_outside_the_repository():
    """Facts the code cites live in docs/notes.md (`docs/notes.md §n`), not in a notes file beside the checkout."""
    found = subprocess.run(["git", "grep", "-n", "-e", "NOTES §", "-e", "NOTES:", "-e", "shared/NOTES", "--", ".",
                            ":!tests/test_docs.py"], cwd=REPO, capture_output=True, text=True).stdout
    assert found == "", found
    cited = set(re.findall(r"docs/notes\.md §(\d+)", subprocess.run(
        ["git", "grep", "-h", "docs/notes.md §"], cwd=REPO, capture_output=True, text=True).stdout))
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs" / "notes.md").read_text(), re.M))
    assert cited and cited <= sections, cited - sections
