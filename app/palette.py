"""Every colour the dashboard's charts and token views draw with: every page and the HTML report colour a method, a
rollout's fate and a part of the rollouts' split the same way (the report's own CSS keeps its two page colours)."""

from __future__ import annotations

import hashlib

GRPO, FASTRL = "#6c757d", "#1f77b4"  # plain GRPO grey, FastRL blue, on every page
METHOD_COLOURS = {"grpo": GRPO, "fastrl": FASTRL}
OTHERS = ["#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]
SPLIT_COLOURS = {"skipped": "#b8c4cc", "merged": "#e9c46a", "pruned": "#e76f51", "kept": "#2a9d8f"}
INK = "#264653"  # lines that belong to no method: rollouts sampled, the mean of a band
DECISION_COLOURS = {"full": INK, "probe": "#e9c46a", "trimmed": "#f4a261", "skip": "#d9d9d9"}
POSITIVE, NEGATIVE = SPLIT_COLOURS["kept"], SPLIT_COLOURS["pruned"]  # correct / wrong; advantage above / below 0
NEUTRAL = "#999999"  # an advantage of 0


def method_colour(method: str) -> str:
    """GRPO grey and FastRL blue (also `grpo+dapo` / `fastrl+dapo`, as the objective's variants); any other method a
    fixed colour from its name's hash, so it is the same on every page and in every process."""
    base = method.partition("+")[0]
    if base in METHOD_COLOURS:
        return METHOD_COLOURS[base]
    return OTHERS[int(hashlib.sha1(method.encode()).hexdigest(), 16) % len(OTHERS)]


def rgba(colour: str, alpha: float) -> str:
    """A "#rrggbb" colour as a CSS rgba() string with opacity `alpha`."""
    red, green, blue = (int(colour.lstrip("#")[i: i + 2], 16) for i in (0, 2, 4))
    return f"rgba({red},{green},{blue},{alpha})"


def method_colours(methods) -> dict[str, str]:
    """method -> colour for Plotly's color_discrete_map."""
    return {m: method_colour(str(m)) for m in methods}
