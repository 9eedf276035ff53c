"""The one builder of a step's store rows: group statistics by hand, rows that validate against the store schema
and are written and read back by the store, and clear errors for mis-sized inputs."""

import math

import numpy as np
import pytest
import torch

from fastrl_core.store import RunWriter, read_groups, read_rollouts, read_steps, read_tokens, schema
from fastrl_core.store.fake_runs import prompt_png
from fastrl_core.algo.group_stats import group_stats
from fastrl_core.store.step_rows import StepRecord, step_rows
from fastrl_core.store.writer import image_key


def test_group_stats_by_hand():
    # group 0: rewards 1, 0, 0.5 -> mean 0.5, population std sqrt((0.25 + 0.25 + 0) / 3) = sqrt(1/6); kept 2
    # group 1: 1.5, 1.5 -> mean 1.5, std 0; group 2: no rollouts -> 0, 0
    # group 3: 1, NaN (a reward function gave none) -> mean 1 over the one reward, std 0; group 4: only NaN -> NaN, 0
    rewards = [1.0, 0.0, 0.5, 1.5, 1.5, 1.0, math.nan, math.nan]
    groups = [0, 0, 0, 1, 1, 3, 3, 4]
    keep = [True, False, True, False, False, True, True, False]
    stats = group_stats(torch.tensor(rewards), torch.tensor(groups), torch.tensor(keep), 5)
    np.testing.assert_allclose(stats.reward_mean[:4], [0.5, 1.5, 0.0, 1.0])
    assert math.isnan(stats.reward_mean[4])
    np.testing.assert_allclose(stats.reward_std, [math.sqrt(1 / 6), 0, 0, 0, 0])
    assert stats.sampled.tolist() == [3, 2, 0, 2, 1]
    assert stats.kept.tolist() == [2, 0, 0, 2, 0]


def test_group_stats_zeroes_rounding_noise_and_checks_group_ids():
    stats = group_stats([0.1 + 0.2, 0.3], [0, 0], [True, True], 1)  # 0.30000000000000004 vs 0.3
    assert stats.reward_std.tolist() == [0.0]
    with pytest.raises(ValueError, match=r"group_index must lie in \[0, 2\)"):
        group_stats([1.0, 1.0], [0, 2], [True, True], 2)
    with pytest.raises(ValueError, match="one entry per rollout"):
        group_stats([1.0], [0, 0], [True, True], 1)


def _result(step=0, **changes) -> StepRecord:
    """Two prompts: p0 with 3 rollouts (one pruned), p1 with 2 equal rewards (both pruned), sketches of D = 4."""
    png = prompt_png(1)
    values = dict(
        step=step, prompt_ids=["p0", "p1"], questions=["How many dots?", "Sides?"], answers=["3", None],
        image_refs=[image_key(png), None], images={image_key(png): png},
        group_index=torch.tensor([0, 0, 0, 1, 1]), completions=["a", "b", "c", "d", "e"],
        lengths=torch.tensor([3, 4, 5, 1, 2]), rewards=torch.tensor([1.5, 0.5, 0.0, 1.0, 1.0]),
        advantages=torch.tensor([1.2, 0.0, -1.2, 0.0, 0.0]), keep_mask=torch.tensor([True, False, True, False, False]),
        reasons=["KEPT", "ZERO_ADVANTAGE", "KEPT", "ZERO_ADVANTAGE", "ZERO_ADVANTAGE"],
        scores=torch.tensor([1.2, 0.0, 1.2, 0.0, 0.0]), weights=torch.tensor([1.0, 0.7, 1.0, 0.0, 0.0]),
        sketches=torch.arange(20, dtype=torch.float32).view(5, 4), format_rewards=[1.0, 1.0, 0.0, 1.0, 0.0],
        accuracy_rewards=[1.0, 0.0, None, 0.5, 0.5], seconds={"generate": 0.25, "store": 0.0},
        cpu_seconds={"generate": 0.125},
        metrics={"loss": 0.1, "lr": 1e-4, "epoch_end": False}, wall_time=2.5,
    )
    values.update(changes)
    return StepRecord(**values)


def test_rows_by_hand():
    rows = step_rows(_result(step=7))
    row = rows.step_row
    assert (row["rollouts_sampled"], row["rollouts_kept"], row["rollouts_per_prompt"]) == (5, 2, 2.5)
    assert row["reward_mean"] == pytest.approx(0.8)
    assert row["accuracy"] == pytest.approx(0.5)  # mean of 1, 0, 0.5, 0.5 (one rollout has none)
    assert row["format_rate"] == pytest.approx(0.6)
    assert row["zero_variance_groups"] == 1  # p1
    assert (row["time_generate"], row["cpu_generate"], row["wall_time"]) == (0.25, 0.125, 2.5)
    assert (row["loss"], row["epoch_end"]) == (0.1, False)
    assert rows.groups == [
        {"prompt_id": "p0", "reward_mean": pytest.approx(2 / 3), "reward_std": pytest.approx(math.sqrt(7 / 18)),
         "sampled": 3, "kept": 2, "merged": 0},
        {"prompt_id": "p1", "reward_mean": 1.0, "reward_std": 0.0, "sampled": 2, "kept": 0, "merged": 0},
    ]
    first, pruned = rows.rollouts[0], rows.rollouts[1]
    assert first["rollout_id"] == "7-0" and first["prompt_id"] == "p0" and first["question"] == "How many dots?"
    assert first["image_ref"] == image_key(prompt_png(1)) and rows.rollouts[3]["image_ref"] is None
    assert pruned["weight"] == 0.0 and first["weight"] == 1.0  # a pruned rollout is recorded with weight 0
    assert rows.rollouts[2]["accuracy_reward"] is None and rows.rollouts[3]["answer"] is None
    assert rows.rollouts[4]["sketch"].tolist() == [16.0, 17.0, 18.0, 19.0]


def test_rows_validate_against_the_store_schema_and_read_back(tmp_path):
    rows = step_rows(_result())
    schema.validate_rows("steps", [rows.step_row], schema.STEPS, extra_numeric=True)
    schema.validate_rows("groups", rows.groups, schema.GROUPS)
    schema.validate_rows("rollouts", rows.rollouts, schema.ROLLOUTS)
    writer = RunWriter(tmp_path, name="rows", config={}, model="m", dataset="d", objective="grpo", pruner="fastrl",
                       budget="fixed")
    rows.write_to(writer)
    step_rows(_result(step=1, images={})).write_to(writer)  # the image is stored once, by step 0
    step_rows(_result(step=2), log_rollouts=False).write_to(writer)  # groups only
    steps = read_steps(tmp_path, writer.run_id)
    assert steps["step"].tolist() == [0, 1, 2] and steps["rollouts_kept"].tolist() == [2, 2, 2]
    assert len(read_groups(tmp_path, writer.run_id)) == 6
    rollouts = read_rollouts(tmp_path, writer.run_id)
    assert len(rollouts) == 10 and rollouts["kept"].sum() == 4


def test_trl_style_rows_without_format_or_accuracy_rewards_validate():
    rows = step_rows(_result(format_rewards=None, accuracy_rewards=None, sketches=None,
                             rewards=torch.tensor([1.0, math.nan, 0.0, 1.0, 1.0]),
                             metrics={"loss": None, "rollouts_topped_up": 0}))
    assert "format_rate" not in rows.step_row and math.isnan(rows.step_row["accuracy"])
    assert rows.step_row["reward_mean"] == pytest.approx(0.75)  # the NaN reward is left out
    schema.validate_rows("steps", [rows.step_row], schema.STEPS, extra_numeric=True)
    schema.validate_rows("rollouts", rows.rollouts, schema.ROLLOUTS)


@pytest.mark.parametrize("field, value, message", [
    ("completions", ["a"], "StepRecord.completions has 1 entries for 5 rollouts"),
    ("weights", torch.ones(4), "StepRecord.weights has 4 entries for 5 rollouts"),
    ("questions", ["q"], "StepRecord.questions has 1 entries for 2 prompts"),
])
def test_missized_inputs_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        step_rows(_result(**{field: value}))


def test_split_of_the_step_by_hand():
    # n = 4 per prompt, 2 prompts -> nominal 8; 5 sampled -> 3 skipped by the budget. p0's rollouts 0 and 1 are
    # one class (multiplicity 2 at 0, 0 at the copy 1), p1's 3 and 4 another (its representative 3 pruned, so the
    # copy 4 is merged, not pruned by the rule). Kept 0 and 2 -> pruned by the rule: 5 - 2 kept - 2 merged = 1 (row 3)
    rows = step_rows(_result(multiplicity=torch.tensor([2, 0, 1, 2, 0]), nominal_per_prompt=4))
    row = rows.step_row
    assert (row["rollouts_nominal"], row["rollouts_skipped"], row["rollouts_merged"], row["rollouts_pruned"],
            row["rollouts_kept"]) == (8, 3, 2, 1, 2)
    assert [g["merged"] for g in rows.groups] == [1, 1]
    assert "rollouts_nominal" not in step_rows(_result()).step_row  # no nominal n given: no split recorded
    with pytest.raises(ValueError, match="merged copy"):
        step_rows(_result(multiplicity=torch.tensor([2, 0, 1, 1, 1]), keep_mask=torch.tensor([1, 1, 0, 0, 0]).bool(),
                          nominal_per_prompt=4))
    with pytest.raises(ValueError, match="multiplicity has 2 entries"):
        step_rows(_result(multiplicity=[1, 1]))


def test_split_is_written_and_read_back(tmp_path):
    writer = RunWriter(tmp_path, name="split", config={}, model="m", dataset="d", objective="grpo", pruner="fastrl",
                       budget="adaptive")
    step_rows(_result(multiplicity=torch.tensor([2, 0, 1, 2, 0]), nominal_per_prompt=4)).write_to(writer)
    steps = read_steps(tmp_path, [writer.run_id])
    assert steps[["rollouts_nominal", "rollouts_skipped", "rollouts_merged", "rollouts_pruned"]].iloc[0].tolist() == \
        [8, 3, 2, 1]
    assert read_groups(tmp_path, writer.run_id)["merged"].tolist() == [1, 1]


def test_tokens_with_their_log_probs_are_stored_for_kept_and_pruned_rollouts(tmp_path):
    ids = torch.tensor([[5, 6, 0], [7, 0, 0], [5, 5, 6], [6, 0, 0], [7, 7, 0]])
    mask = ids > 0
    logprobs = torch.tensor([[-0.1234, -2.0, 0.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -3.0], [-0.25, 0, 0],
                             [-4.0, -4.0, 0.0]])
    decoded = []
    rows = step_rows(_result(token_ids=ids, token_mask=mask, token_logprobs=logprobs,
                             decode_token=lambda t: decoded.append(t) or {5: "a", 6: " b", 7: "\\boxed{"}[t]))
    def pairs(row):
        return list(zip(row["token_text"].tolist(), row["token_logprob"].tolist()))

    assert pairs(rows.rollouts[0]) == [("a", pytest.approx(-0.123)), (" b", -2.0)]  # rounded to 3 decimals
    assert pairs(rows.rollouts[1]) == [("\\boxed{", -0.5)]  # a pruned rollout has its tokens too
    assert sorted(decoded) == [5, 6, 7]  # each token id decoded once per step
    writer = RunWriter(tmp_path, name="tokens", config={}, model="m", dataset="d", objective="grpo", pruner="fastrl",
                       budget="adaptive")
    rows.write_to(writer)
    assert read_tokens(tmp_path, writer.run_id, 0, "0-2") == [("a", -1.0), ("a", -1.0), (" b", -3.0)]
    assert not {"token_text", "token_logprob"} & set(read_rollouts(tmp_path, writer.run_id).columns)  # not by default
    assert "token_text" not in step_rows(_result()).rollouts[0]  # no tokens given: none recorded


def test_a_merged_copy_is_recorded_as_duplicate_whatever_became_of_its_representative():
    """The pruner gives a copy of a pruned row that row's reason (`prune_distinct`, pinned by the fastrl guard);
    the store records every copy as DUPLICATE, so each row is kept, merged or pruned, as the split counts them."""
    # rollouts 0, 1 are one class (0 kept, 1 its copy); 3, 4 one class whose representative 3 the rule pruned
    rows = step_rows(_result(multiplicity=torch.tensor([2, 0, 1, 2, 0]), nominal_per_prompt=4,
                             reasons=["KEPT", "DUPLICATE", "KEPT", "ZERO_ADVANTAGE", "ZERO_ADVANTAGE"]))
    assert [r["reason"] for r in rows.rollouts] == ["KEPT", "DUPLICATE", "KEPT", "ZERO_ADVANTAGE", "DUPLICATE"]
    assert sum(r["reason"] == "DUPLICATE" for r in rows.rollouts) == rows.step_row["rollouts_merged"] == 2
    assert [r["reason"] for r in step_rows(_result()).rollouts] == _result().reasons  # nothing merged: as given


def test_token_lists_are_checked_row_by_row(tmp_path):
    writer = RunWriter(tmp_path, name="tokens", config={}, model="m", dataset="d", objective="grpo", pruner="fastrl",
                       budget="adaptive")
    rows = step_rows(_result())
    bad = [dict(row, token_text=["a"], token_logprob=[-0.5]) for row in rows.rollouts]
    bad[2]["token_logprob"] = [-0.5, -1.0]
    with pytest.raises(ValueError, match="rollouts row 2: keys 'token_text' and 'token_logprob' must both be lists "
                                         "of one length"):
        writer.write_step(0, step_row=rows.step_row, groups=rows.groups, rollouts=bad, images=rows.images)
    bad[2].update(token_text=["a", 7], token_logprob=[-0.5, -1.0])
    with pytest.raises(ValueError, match="rollouts row 2: key 'token_text' must hold only strs, got int 7"):
        writer.write_step(0, step_row=rows.step_row, groups=rows.groups, rollouts=bad, images=rows.images)
    bad[2].update(token_text="ab")
    with pytest.raises(ValueError, match="rollouts row 2: key 'token_text' must be a list of strs, got str"):
        writer.write_step(0, step_row=rows.step_row, groups=rows.groups, rollouts=bad, images=rows.images)
    assert read_steps(tmp_path, writer.run_id).empty  # nothing half-written
