"""`evaluate_with`: greedy decoding, or mean@k over k sampled completions per problem, scored per kind."""

import pytest
import torch

from fastrl_core.data.templates import answer_style
from fastrl_core.engines.hf import HFEngine
from fastrl_core.evaluate import evaluate_with
from fastrl_core.policy import load_policy
from fastrl_core.rewards import score_completions
from fastrl_core.run_config import load_config
from fastrl_core.run_setup import load_datasets


@pytest.fixture(scope="module")
def setup():
    config = load_config("embedded", ["synthetic_train=8", "synthetic_test=10", "prompts_per_step=8"])
    policy = load_policy("embedded")
    engine = HFEngine(policy, template=config.template, max_new_tokens=8, temperature=1.0)
    return config, policy, engine, load_datasets(config)[1][:10]


def test_mean_at_k_scores_k_completions_per_problem_in_problem_order(setup):
    config, policy, engine, problems = setup
    result = evaluate_with(engine, policy, problems, template=config.template, samples=3, batch_size=4,
                           generator=torch.Generator().manual_seed(0), progress=False)
    assert result["n"] == 10 and len(result["completions"]) == 30
    again = evaluate_with(engine, policy, problems, template=config.template, samples=3, batch_size=4,
                          generator=torch.Generator().manual_seed(0), progress=False)
    assert again["completions"] == result["completions"]  # the generator decides the draws
    scored = score_completions(result["completions"], [p for p in problems for _ in range(3)],
                               style=answer_style(config.template))
    assert result["accuracy"] == pytest.approx(sum(p.accuracy for p in scored) / 30)
    kinds = {p.kind for p in problems}
    assert set(result["per_kind"]) == kinds
    greedy = evaluate_with(engine, policy, problems, template=config.template, progress=False)
    assert greedy["n"] == 10 and len(greedy["completions"]) == 10


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_sample_count_is_refused(setup, bad):
    config, policy, engine, problems = setup
    with pytest.raises(ValueError, match="samples must be an integer >= 0"):
        evaluate_with(engine, policy, problems, template=config.template, samples=bad, progress=False)
