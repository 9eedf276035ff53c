"""Every colour the charts and token views draw with is in app/palette.py; the tables' sizes are named in charts."""

from __future__ import annotations

import re
from pathlib import Path

from fastrl_app.palette import INK, NEGATIVE, rgba

APP = Path(__file__).resolve().parent.parent / "app"
COLOUR = re.compile(r"#[0-9a-fA-F]{6}\b|rgba?\(\s*\d")  # a hex colour or a literal rgb()/rgba()
OWN_CSS = {"report.py"}  # the offline report's stylesheet keeps its two page colours


def test_no_page_or_chart_holds_a_colour_of_its_own():
    found = [f"{path.relative_to(APP)}:{number}: {line.strip()}"
             for path in sorted(APP.rglob("*.py")) if path.name not in {"palette.py", *OWN_CSS}
             for number, line in enumerate(path.read_text().splitlines(), 1) if COLOUR.search(line)]
    assert not found, "\n".join(found)


def test_rgba_by_hand():
    assert rgba(INK, 0.15) == "rgba(38,70,83,0.15)"  # #264653
    assert rgba(NEGATIVE, 0.08) == "rgba(231,111,81,0.08)"  # #e76f51


def test_image_table_heights_by_hand():
    from fastrl_app.charts import IMAGE_ROW_HEIGHT, TABLE_MAX_HEIGHT, image_table_height

    assert IMAGE_ROW_HEIGHT == 64
    assert image_table_height(3) == 40 + 3 * 65  # header + rows of 64 px and a 1 px border
    assert image_table_height(100, most=TABLE_MAX_HEIGHT) == 1100
    assert image_table_height(0) == 40
