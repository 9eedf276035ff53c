"""Prompt templates: the user-message text for a problem, and the final-answer style its reward expects.

The image is not part of this text: it goes into the chat message as its own content item (fastrl_core.policy).
A problem's `question` already lists multiple-choice options (`Choices: A. ..  B. ..`, display order), so every
template shows them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastrl_core.data.problems import Problem, with_choices


@dataclass(frozen=True)
class Template:
    text: str  # "{question}" is replaced by the problem's question
    answer_style: str  # "boxed" | "answer_tag": the final-answer format rewards.format_reward expects


TEMPLATES: dict[str, Template] = {
    # EasyR1 examples/format_prompt/math.jinja (the authors' setup): reasoning in <think>, answer in \boxed{}.
    "math": Template(
        "{question} You FIRST think about the reasoning process as an internal monologue and then provide the final "
        "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put "
        "in \\boxed{}.",
        "boxed",
    ),
    # R1-V (GeoQA): answer in <answer> tags.
    "r1v": Template(
        "{question} Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> "
        "tags.",
        "answer_tag",
    ),
    # The same instruction as "math" in a few words: shorter prompts for the tiny embedded model.
    "short": Template("{question} Think in <think> </think>, then answer in \\boxed{}.", "boxed"),
}


def _template(name: str) -> Template:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise KeyError(f"unknown template {name!r}; choose one of {sorted(TEMPLATES)}") from None


def render_prompt(problem: Problem, template: str) -> str:
    """The user-message text for `problem` under template `template` (without the image)."""
    question = with_choices(problem.question.strip(), problem.choices)
    return _template(template).text.replace("{question}", question, 1)


def answer_style(template: str) -> str:
    """"boxed" or "answer_tag": the final-answer format the reward expects for `template`."""
    return _template(template).answer_style
