"""Rewards: pure functions from completions to floats (open-r1 style), format + math-aware accuracy.

overall = format_weight * format + accuracy_weight * accuracy, by default 0.5 * format + 1.0 * accuracy (the
authors' setup, docs/notes.md §1), so a reward lies in {0, 0.5, 1, 1.5}.

Format ("boxed" style, EasyR1 math): `<think>…</think>`, then any text, then exactly one `\\boxed{…}` with nothing but
whitespace after it. ("answer_tag" style, R1-V): `<think>…</think>` then only whitespace, then `<answer>…</answer>`,
then only whitespace. One think block only; the final answer must not be empty. (EasyR1's regex accepts trailing
text; we reject it because a tiny policy otherwise drifts to `\\boxed{A}}}}`, docs/notes.md §2.)

Accuracy (independent of format): the last `\\boxed{…}` (or last `<answer>…</answer>`) is compared with the ground
truth by value: both sides get Unicode math and units normalised (√{6}, √6 -> \\sqrt{6}; π -> \\pi; °, ^\\circ, 度
dropped; ×, ÷, ·; full-width forms; trailing units cm, m, mm, km, 米, 厘米, …), then exact string match (fast path),
plain-number comparison, and otherwise math-verify `parse` + `verify` on the `$…$`-wrapped strings. For multiple
choice, the option letter (`B`, `(B)`, `B.`, `B. 60`, `\\text{B}`) or the option's value counts; another letter
scores 0 whatever follows it. Words (yes/no, colours) compare case-insensitively as strings.

Cost: exact, numeric and word answers take ~0.04 ms; a math-verify comparison ~8-12 ms (50 ms for odd LaTeX).
math-verify guards itself with signal.alarm, which only works in the main thread: there we pass a 2 s timeout;
elsewhere it runs without one. In every thread an answer that would make sympy crawl scores 0 unparsed unless it
equals the gold string: longer than MAX_ANSWER_CHARS, a nested power or one above MAX_EXPONENT (`9^{9^{9}}` hit the
timeout, `(x+y+z)^{20}` took 0.9 s), or a factorial above 20! (measured on these CPUs).
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from dataclasses import dataclass
from typing import Sequence

from fastrl_core.data.problems import LETTERS, Problem

STYLES = ("boxed", "answer_tag")
MAX_ANSWER_CHARS = 200  # longer extracted answers are not parsed (pathological input guard)
MAX_EXPONENT = 12  # answers with a larger or nested power, or n! with n > 20, are not parsed (see _too_costly)
VERIFY_TIMEOUT_S = 2

_THINK = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_TAG_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_LETTER = re.compile(r"\(?([A-Z])\)?(?:[.:)]\s*.*)?", re.DOTALL)


@dataclass(frozen=True)
class RewardParts:
    overall: float
    format: float
    accuracy: float


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown answer style {style!r}; choose one of {list(STYLES)}")


def _boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every `\\boxed{…}` with balanced braces; end is just past the closing brace."""
    spans = []
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            spans.append((match.start(), i, text[match.end(): i - 1]))
    return spans


def format_reward(completion: str, style: str = "boxed") -> float:
    """1.0 iff `<think>…</think>` then exactly one non-empty final answer in `style` and only whitespace after it."""
    _check_style(style)
    match = _THINK.fullmatch(completion)
    if match is None or "<think>" in match.group(1):
        return 0.0
    rest = match.group(2)
    if "<think>" in rest or "</think>" in rest:
        return 0.0
    if style == "answer_tag":
        tagged = _ANSWER_TAG_ONLY.fullmatch(rest)
        ok = tagged is not None and "<answer>" not in tagged.group(1) and bool(tagged.group(1).strip())
        return float(ok)
    spans = _boxed_spans(rest)
    ok = (
        len(spans) == 1
        and rest.count("\\boxed") == 1
        and not rest[spans[0][1]:].strip()
        and bool(spans[0][2].strip())
    )
    return float(ok)


def extract_answer(completion: str, style: str) -> str | None:
    """The final answer: content of the last `\\boxed{…}` ("boxed") or last `<answer>…</answer>` ("answer_tag")."""
    _check_style(style)
    if style == "boxed":
        spans = _boxed_spans(completion)
        return spans[-1][2].strip() if spans else None
    tagged = _ANSWER_TAG.findall(completion)
    return tagged[-1].strip() if tagged else None


# ---- value comparison -----------------------------------------------------------------------------------------

_UNITS = (
    "平方厘米|平方分米|平方毫米|平方千米|平方米|立方厘米|立方米|厘米|毫米|分米|千米|公里|米|度|个|"
    "cm|mm|dm|km|m|degrees|degree|deg|units|unit|inches|inch|in|ft|feet"
)
_TRAILING_UNIT = re.compile(rf"(?<=[\d}})\s.])\s*(?:\\[,;! ])?\s*(?:{_UNITS})(?:\^\{{?[23]\}}?|[23])?\s*$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textrm|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°|∘")


def normalize_answer(text: str) -> str:
    """Unicode math and units -> plain LaTeX (see the module docstring); whitespace collapsed."""
    s = text.strip()
    s = s.replace("²", "^2").replace("³", "^3").replace("㎡", "m^2").replace("㎠", "cm^2")
    s = unicodedata.normalize("NFKC", s)  # full-width digits and letters, ㎝ -> cm, ㎜ -> mm
    for opening, closing in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(opening) and s.endswith(closing) and len(s) >= len(opening) + len(closing):
            s = s[len(opening): len(s) - len(closing)].strip()
    s = _TEXT_WRAPPER.sub(r"\1", s)
    s = _DEGREES.sub("", s)
    s = re.sub(r"√\s*\{", r"\\sqrt{", s)
    s = re.sub(r"√\s*\(([^()]*)\)", r"\\sqrt{\1}", s)
    s = re.sub(r"√\s*([0-9.]+|[A-Za-z])", r"\\sqrt{\1}", s)
    s = s.replace("π", "\\pi ").replace("×", "\\times ").replace("÷", "\\div ").replace("·", "\\cdot ")
    s = s.replace("−", "-").replace("–", "-")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\s+", " ", s).strip()
    while True:  # "3 cm", "20米", "12 cm^2", "5\,m"
        stripped = _TRAILING_UNIT.sub("", s).strip()
        if stripped == s or not stripped:
            break
        s = stripped
    return s.rstrip(".。").strip()


def _as_number(s: str) -> float | None:
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?", s):  # thousands separators
        s = s.replace(",", "")
    return float(s) if _NUMBER.fullmatch(s) else None


def _too_costly(answer: str) -> bool:
    """Whether sympy could crawl on `answer`: too long, a nested or large power, or a large factorial."""
    if len(answer) > MAX_ANSWER_CHARS or answer.count("^") > 4:
        return True
    for match in re.finditer(r"\^\s*", answer):
        rest = answer[match.end():]
        if rest.startswith("{"):
            depth, end = 0, 0
            for end, char in enumerate(rest):
                depth += {"{": 1, "}": -1}.get(char, 0)
                if depth == 0:
                    break
            exponent = rest[1:end]
        else:
            exponent = re.match(r"[+-]?\d+|.?", rest).group()
        if "^" in exponent or any(int(n) > MAX_EXPONENT for n in re.findall(r"\d+", exponent)):
            return True
    return any(int(n) > 20 for n in re.findall(r"(\d+)\s*!", answer))


def _timeout() -> int | None:
    return VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parsed(normalized: str):
    from math_verify import parse

    return parse(f"${normalized}$", parsing_timeout=_timeout())


def values_equal(gold: str, given: str) -> bool:
    """Whether `given` states the same value as `gold` (normalised string, number, then math-verify)."""
    if len(given) > MAX_ANSWER_CHARS:
        return False
    g, p = normalize_answer(gold), normalize_answer(given)
    if not g or not p:
        return False
    if g.replace(" ", "") == p.replace(" ", ""):
        return True
    g_number, p_number = _as_number(g), _as_number(p)
    if g_number is not None and p_number is not None:
        return abs(g_number - p_number) <= 1e-9 * max(1.0, abs(g_number))
    if not re.search(r"[\d\\]", g):  # a word (yes / no / red): strings only
        return g.casefold() == p.casefold()
    if g_number is not None and not re.search(r"[\d\\]", p):  # a number is never stated without digits or LaTeX
        return False
    if _too_costly(p):
        return False
    from math_verify import verify

    gold_parsed, given_parsed = _parsed(g), _parsed(p)
    if not gold_parsed or not given_parsed:
        return False
    return bool(verify(gold_parsed, given_parsed, timeout_seconds=_timeout()))


def _stated_letter(given: str, n_choices: int) -> str | None:
    """The option letter `given` names ("B", "(B)", "B.", "B. 60", "\\text{B}"), or None."""
    s = _TEXT_WRAPPER.sub(r"\1", given.strip().strip("$")).strip()
    match = _LETTER.fullmatch(s)
    if match is None or match.group(1) not in LETTERS[:n_choices]:
        return None
    return match.group(1)


def accuracy_reward(completion: str, problem: Problem, style: str = "boxed") -> float:
    """1.0 iff the completion's final answer states the problem's answer (letter or value for multiple choice)."""
    given = extract_answer(completion, style)
    if given is None or not given:
        return 0.0
    if problem.choices is not None:
        letter = _stated_letter(given, len(problem.choices))
        if letter is not None:
            return float(letter == problem.answer)
    if given == problem.answer_value:
        return 1.0
    return float(values_equal(problem.answer_value, given))


def score_completions(completions: Sequence[str], problems: Sequence[Problem], *, style: str = "boxed",
                      format_weight: float = 0.5, accuracy_weight: float = 1.0) -> list[RewardParts]:
    """Reward parts for each (completion, problem) pair: overall = format_weight*format + accuracy_weight*accuracy."""
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completions but {len(problems)} problems")
    _check_style(style)
    parts = []
    for completion, problem in zip(completions, problems):
        fmt = format_reward(completion, style)
        acc = accuracy_reward(completion, problem, style)
        parts.append(RewardParts(format_weight * fmt + accuracy_weight * acc, fmt, acc))
    return parts
