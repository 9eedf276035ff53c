"""fastrl_app.metrics: intervals, curves and speed-ups checked against figures computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrl_app import metrics, savings

T_975_DF1, T_975_DF2 = 12.706204736, 4.302652730  # Student t quantiles from a printed table


def test_mean_ci_by_hand():
    ci = metrics.mean_ci([1.0, 2.0, 3.0])  # mean 2, s = 1, half = t(0.975, 2) / sqrt(3)
    assert ci.mean == 2.0 and ci.n == 3
    assert ci.high - 2.0 == pytest.approx(T_975_DF2 / math.sqrt(3)) and ci.low == pytest.approx(4 - ci.high)
    one = metrics.mean_ci([0.7, None, float("nan")])  # missing values are left out, one value has no interval
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert metrics.mean_ci([]).n == 0 and metrics.mean_ci([]).text() == "—"
    assert metrics.mean_ci([0.5, 0.5]).text() == "0.500 ± 0.000"


def test_ratio_ci_is_taken_on_the_log_ratio():
    ci = metrics.ratio_ci([2.0, 8.0])  # logs ln2, ln8: mean ln4, sd ln4 / sqrt(2), half = t(0.975, 1) * ln4 / 2
    assert ci.mean == pytest.approx(4.0) and ci.n == 2
    assert ci.high == pytest.approx(4.0 * math.exp(T_975_DF1 * math.log(2)))
    assert ci.low * ci.high == pytest.approx(16.0)  # symmetric in log space
    inverse = metrics.ratio_ci([0.5, 0.125])
    assert inverse.mean == pytest.approx(1 / ci.mean) and inverse.low == pytest.approx(1 / ci.high)
    assert metrics.ratio_ci([1.5, None]).mean == 1.5 and metrics.ratio_ci([None]).n == 0
    with pytest.raises(ValueError, match="ratios must be > 0"):
        metrics.ratio_ci([1.0, -2.0])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=12))
def test_mean_ci_contains_the_mean_and_narrows_with_confidence(values):
    wide, narrow = metrics.mean_ci(values, 0.99), metrics.mean_ci(values, 0.8)
    assert wide.low <= narrow.low + 1e-9 <= narrow.mean + 2e-9 <= narrow.high + 3e-9 <= wide.high + 4e-9
    assert narrow.mean == pytest.approx(np.mean(values))


def test_trailing_mean_and_final_accuracy():
    assert metrics.trailing_mean([0.4, 0.5, 0.6, 0.7]).tolist() == pytest.approx([0.4, 0.45, 0.5, 0.6])
    curve = pd.DataFrame({"step": [0, 1, 2, 3, 4], "accuracy": [0.9, 0.1, 0.5, 0.6, 0.7]})
    assert metrics.final_accuracy(curve) == pytest.approx(0.6)
    assert metrics.final_accuracy(curve.iloc[:2]) == pytest.approx(0.1)  # only one evaluation after step 0
    assert metrics.final_accuracy(curve.iloc[:1]) == pytest.approx(0.9)  # the warm start only


def test_eval_curve_times_an_evaluation_by_the_steps_before_it():
    steps = pd.DataFrame({"step": [0, 1, 2, 3], "wall_time": [1.0, 2.0, 3.0, 4.0],
                          "cpu_update": [0.5] * 4, "cpu_generate": [0.25] * 4, "rollouts_sampled": [8, 6, 4, 2]})
    evals = pd.DataFrame({"step": [0, 2, 4], "accuracy": [0.3, 0.4, 0.5]})
    curve = metrics.eval_curve(steps, evals)
    assert curve["wall_time"].tolist() == [0.0, 2.0, 4.0]  # eval at step 2 follows steps 0 and 1
    assert curve["cpu_time"].tolist() == [0.0, 1.5, 3.0]
    assert curve["rollouts"].tolist() == [0.0, 14.0, 20.0]
    evals["wall_time"] = [0.0, 2.5, np.nan]  # the eval row's own clock wins when recorded
    assert metrics.eval_curve(steps, evals)["wall_time"].tolist() == [0.0, 2.5, 4.0]
    old_store = metrics.eval_curve(steps[["step", "wall_time"]], evals)  # no cpu_ columns: NaN, no error
    assert old_store["cpu_time"].iloc[1:].isna().all() and old_store["rollouts"].iloc[1:].isna().all()


def test_area_under_curve_by_hand():
    curve = pd.DataFrame({"step": [0, 1, 2], "wall_time": [0.0, 1.0, 2.0], "accuracy": [0.3, 0.4, 0.5]})
    assert metrics.area_under_curve(curve, 2.0) == pytest.approx((0.35 + 0.45) / 2)
    assert metrics.area_under_curve(curve, 1.5) == pytest.approx((0.35 + 0.5 * 0.425) / 1.5)
    assert metrics.area_under_curve(curve, 4.0) == pytest.approx((0.35 + 0.45 + 2 * 0.5) / 4)  # flat after the end
    assert math.isnan(metrics.area_under_curve(curve.iloc[1:], 2.0))  # not evaluated at 0 s


# Two seeds of GRPO (1 s and 16 rollouts per step) and FastRL (0.5 s and 4 rollouts per step), 4 steps, evaluated
# after every step.
ACCURACY = {("grpo", 0): [0.3, 0.4, 0.5, 0.6, 0.7], ("grpo", 1): [0.3, 0.5, 0.5, 0.5, 0.5],
            ("fastrl", 0): [0.3, 0.6, 0.6, 0.6, 0.6], ("fastrl", 1): [0.3, 0.6, 0.7, 0.7, 0.7]}
RATE = {"grpo": 1.0, "fastrl": 0.5}
SAMPLED, KEPT = {"grpo": 16, "fastrl": 4}, {"grpo": 16, "fastrl": 3}
CPU_UPDATE = {"grpo": 0.8, "fastrl": 0.2}


def designed() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    labels, steps, evals = [], [], []
    for (method, seed), accuracy in ACCURACY.items():
        run_id = f"{method}-{seed}"
        labels.append({"run_id": run_id, "method": method, "seed": seed, "objective": "grpo",
                       "is_baseline": method == "grpo"})
        for step in range(4):
            steps.append({"run_id": run_id, "step": step, "wall_time": (step + 1) * RATE[method],
                          "rollouts_sampled": SAMPLED[method], "rollouts_kept": KEPT[method],
                          "time_update": RATE[method] / 2, "cpu_update": CPU_UPDATE[method]})
        for step, value in enumerate(accuracy):
            evals.append({"run_id": run_id, "step": step, "accuracy": value, "wall_time": step * RATE[method]})
    return pd.DataFrame(labels), pd.DataFrame(steps), pd.DataFrame(evals)


def test_compare_runs_by_hand():
    table = metrics.compare_runs(*designed()).set_index("run_id")
    # per seed, acc0 0.3: GRPO finals 0.6 and 0.5 -> targets 0.3 + 0.9 * 0.3 = 0.57 and 0.3 + 0.9 * 0.2 = 0.48
    # (from the mean gain, 0.525, grpo-1 would never reach its target)
    assert table["target_accuracy"].tolist() == pytest.approx([0.57, 0.48, 0.57, 0.48])
    # trailing means of up to 3 evals after step 0: grpo-0 0.4, 0.45, 0.5, 0.6 -> step 4 = 4 s; grpo-1 0.5 ... ->
    # step 1 = 1 s; fastrl-0 0.6 -> step 1 = 0.5 s; fastrl-1 0.6 -> 0.5 s
    assert table.loc["grpo-0", "time_to_target"] == 4.0 and table.loc["grpo-1", "time_to_target"] == 1.0
    assert table.loc["fastrl-0", "time_to_target"] == 0.5 and table.loc["fastrl-1", "time_to_target"] == 0.5
    assert table.loc["fastrl-0", "target_speedup"] == pytest.approx(8.0)
    assert table.loc["fastrl-1", "target_speedup"] == pytest.approx(2.0)
    assert table.loc["fastrl-0", "step_speedup"] == pytest.approx(2.0)  # 4 s vs 2 s for the same 4 steps
    assert table.loc["fastrl-1", "cpu_step_speedup"] == pytest.approx(4.0)  # 3.2 vs 0.8 CPU s
    assert table.loc["grpo-1", "step_speedup"] == pytest.approx(1.0)
    # final accuracies (last 3 evals): grpo 0.6 / 0.5, fastrl 0.6 / 0.7 -> paired gains 0.0 / +0.2
    assert table.loc["fastrl-0", "accuracy_gain"] == pytest.approx(0.0)
    assert table.loc["fastrl-1", "accuracy_gain"] == pytest.approx(0.2)
    assert table.loc["grpo-1", "accuracy_gain"] == pytest.approx(0.0)
    # at equal time: fastrl-0's last 3 evals (1, 1.5, 2 s; 0.6 each) against grpo-0 there (0.4, 0.45, 0.5)
    assert table.loc["fastrl-0", "gain_at_equal_time"] == pytest.approx(0.15)
    assert table.loc["fastrl-1", "gain_at_equal_time"] == pytest.approx(0.2)  # 0.7 against a flat 0.5
    assert table.loc["grpo-0", "gain_at_equal_time"] == pytest.approx(0.0)
    # against rollouts: grpo-0 reaches the target after 4 x 16, fastrl-0 after 1 x 4; fastrl-0's last 3 evals (8,
    # 12, 16 rollouts; 0.6 each) against grpo-0 there (0.35, 0.375, 0.4)
    assert table.loc["grpo-0", "rollouts_to_target"] == 64 and table.loc["fastrl-0", "rollouts_to_target"] == 4
    assert table.loc["fastrl-0", "target_rollout_share"] == pytest.approx(4 / 64)
    assert table.loc["fastrl-1", "target_rollout_share"] == pytest.approx(4 / 16)
    assert table.loc["fastrl-0", "gain_at_equal_rollouts"] == pytest.approx(0.225)
    assert table.loc["fastrl-1", "gain_at_equal_rollouts"] == pytest.approx(0.25)  # 0.7 against 0.4, 0.45, 0.5
    # horizon: the shortest run, 2 s; grpo-0 over [0, 2]: (0.35 + 0.45) / 2; fastrl-0: (0.5 * 0.45 + 1.5 * 0.6) / 2
    assert table["horizon"].tolist() == [2.0] * 4
    assert table.loc["grpo-0", "auc"] == pytest.approx(0.4)
    assert table.loc["fastrl-0", "auc"] == pytest.approx(0.5625)
    assert table.loc["fastrl-0", "kept_fraction"] == pytest.approx(3 / 4)
    assert table.loc["fastrl-0", "seconds_per_step"] == 0.5 and table.loc["fastrl-0", "time_update"] == 0.25


@pytest.mark.parametrize("x", ["wall_time", "rollouts"])
def test_gain_at_equal_x_needs_the_baseline_to_have_run_that_far(x):
    base = pd.DataFrame({"step": [0, 2, 4], x: [0.0, 2.0, 4.0], "accuracy": [0.3, 0.5, 0.7]})
    slower = pd.DataFrame({"step": [0, 2, 4], x: [0.0, 3.0, 6.0], "accuracy": [0.3, 0.5, 0.7]})
    assert metrics.gain_at_equal(base, base, x=x) == 0.0
    assert math.isnan(metrics.gain_at_equal(slower, base, x=x))  # 6: GRPO never trained (or sampled) that far
    # base at 2 and 4 against the slower curve there: 0.3 + 0.2 * 2/3 and 0.5 + 0.2 * 1/3
    assert metrics.gain_at_equal(base, slower, x=x) == pytest.approx(np.mean([0.5 - (0.3 + 0.2 * 2 / 3),
                                                                             0.7 - (0.5 + 0.2 / 3)]))


def test_difference_at_equal_reads_both_runs_where_the_shorter_one_ends():
    longer = pd.DataFrame({"step": [0, 2, 4], "rollouts": [0.0, 3.0, 6.0], "accuracy": [0.3, 0.5, 0.7]})
    shorter = pd.DataFrame({"step": [0, 2, 4], "rollouts": [0.0, 2.0, 4.0], "accuracy": [0.3, 0.6, 0.7]})
    # the shorter run at 2 and 4 against the longer curve there: 0.3 + 0.2 * 2/3 and 0.5 + 0.2 * 1/3
    shorter_ahead = np.mean([0.6 - (0.3 + 0.2 * 2 / 3), 0.7 - (0.5 + 0.2 / 3)])
    assert metrics.difference_at_equal(shorter, longer) == pytest.approx(shorter_ahead)
    assert metrics.difference_at_equal(longer, shorter) == pytest.approx(-shorter_ahead)  # same reading, A − B
    assert metrics.difference_at_equal(longer, longer) == 0.0


def test_summarise_gives_intervals_over_seeds():
    summary = metrics.summarise(metrics.compare_runs(*designed())).set_index("method")
    fastrl = summary.loc["fastrl"]
    assert fastrl["seeds"] == [0, 1] and fastrl["target_reached"] == 2 and summary.loc["grpo", "target_reached"] == 2
    assert fastrl["target_accuracy"] == pytest.approx((0.57 + 0.48) / 2)
    final = metrics.interval(fastrl, "final_accuracy")  # 0.6, 0.7: half = t(0.975, 1) * 0.0707 / sqrt(2)
    assert final.mean == pytest.approx(0.65) and final.high - final.mean == pytest.approx(T_975_DF1 * 0.05)
    gain = metrics.interval(fastrl, "accuracy_gain")  # 0.0, 0.2: half = t(0.975, 1) * 0.1414 / sqrt(2)
    assert gain.mean == pytest.approx(0.1) and gain.high - gain.mean == pytest.approx(T_975_DF1 * 0.1)
    step = metrics.interval(fastrl, "step_speedup")
    assert (step.mean, step.low, step.high, step.n) == pytest.approx((2.0, 2.0, 2.0, 2))
    target = metrics.interval(fastrl, "target_speedup")  # 8 and 2: geometric mean 4, interval on the logs
    half = T_975_DF1 * math.log(4) / math.sqrt(2) / math.sqrt(2)  # sd of (log 8, log 2) = log 4 / sqrt 2
    assert target.mean == pytest.approx(4.0) and target.n == 2 and target.high == pytest.approx(4 * math.exp(half))
    one = metrics.ratio_ci([8.0, None])  # one pair: a value without an interval
    assert one.n == 1 and math.isnan(one.low) and one.text(".2f", "×") == "8.00× (n=1)"
    share = metrics.interval(fastrl, "target_rollout_share")
    assert share.mean == pytest.approx(1 / 8) and share.n == 2
    assert metrics.interval(fastrl, "gain_at_equal_rollouts").mean == pytest.approx((0.225 + 0.25) / 2)


def test_band_is_the_mean_of_the_seeds_curves_with_their_interval():
    curves = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "wall_time": [0.0, 2.0, 0.0, 4.0],
                           "accuracy": [0.2, 0.6, 0.4, 0.8]})
    band = metrics.band(curves, points=3)  # common grid 0, 1, 2: a = 0.2, 0.4, 0.6; b = 0.4, 0.5, 0.6
    assert band["wall_time"].tolist() == [0.0, 1.0, 2.0]
    assert band["mean"].tolist() == pytest.approx([0.3, 0.45, 0.6])
    assert band["high"].iloc[0] - 0.3 == pytest.approx(T_975_DF1 * 0.1414214 / math.sqrt(2))
    assert band["low"].iloc[2] == pytest.approx(0.6) and (band["n"] == 2).all()


def test_run_labels_read_bench_names_and_fall_back_to_the_config():
    runs = pd.DataFrame({"run_id": ["r1", "r2", "r3", "r4", "r5"],
                         "name": ["bench-fastrl+gspo-seed3", "bench-grpo-seed0", "x", "fastrl", "grpo"],
                         "config": ['{"seed": 3}', '{"seed": 0}', '{"seed": 7}', "{}", '{"seed": 1}'],
                         "pruner": ["fastrl", "none", "cppo", "fastrl", "none"],
                         "budget": ["adaptive", "fixed", "fixed", "adaptive", "fixed"],
                         "objective": ["gspo", "grpo", "dapo", "grpo", "grpo"]})
    labels = metrics.run_labels(runs)
    assert labels["method"].tolist() == ["fastrl+gspo", "grpo", "cppo+dapo", "fastrl·adaptive", "grpo"]
    assert labels["seed"].tolist() == [3, 0, 7, 0, 1]
    assert labels["is_baseline"].tolist() == [False, True, False, False, True]
    assert metrics.bench_run_name("fastrl+gspo", 3) == "bench-fastrl+gspo-seed3"


def test_time_to_target_ignores_the_warm_start_and_says_never():
    curve = pd.DataFrame({"step": [0, 2, 4, 6], "wall_time": [0.0, 1.0, 2.0, 3.0], "accuracy": [0.9, 0.5, 0.7, 0.6]})
    assert metrics.time_to_target(curve, 0.6) == 2.0  # trailing means 0.5, 0.6: the 0.9 at step 0 never counts
    assert metrics.time_to_target(curve, 0.61) is None
    assert metrics.time_to_target(curve, 0.5, x="step") == 2.0


def test_phase_costs_by_hand():
    """Three steps on an exact line fit it exactly; a count that never varies has no fit (NaN, not a guess)."""
    steps = pd.DataFrame({
        "rollouts_sampled": [128, 64, 96], "rollouts_kept": [40, 40, 40], "update_rows": [80, 80, 80],
        "time_generate": [0.2 + 0.003 * 128, 0.2 + 0.003 * 64, 0.2 + 0.003 * 96],
        "time_logprob": [0.1, 0.2, 0.3], "time_update": [0.3, 0.3, 0.3]})
    costs = metrics.phase_costs(steps).set_index("phase")
    assert costs.loc["generate", "count"] == "rollouts_sampled"
    assert costs.loc["generate", "fixed"] == pytest.approx(0.2)
    assert costs.loc["generate", "per_rollout"] == pytest.approx(0.003)
    assert costs.loc["generate", "r2"] == pytest.approx(1.0)
    assert costs.loc["generate", "steps"] == 3
    assert math.isnan(costs.loc["update", "fixed"]) and math.isnan(costs.loc["logprob", "r2"])


def test_the_update_line_counts_the_rows_the_update_runs_not_the_rows_kept():
    """Under the exact merge a kept row runs once per mini-batch holding a copy: 30 ms per update row and 20 kept
    rows standing for 60 update rows give an update line through 0 on update_rows. Fitted on the kept rows instead
    (what the lines did before 2026-12-07), the same steps look mostly fixed. A store without update_rows (older
    runs, or all NaN) falls back to the rows kept."""
    kept = np.array([20.0, 30.0, 40.0, 25.0])
    update_rows = np.array([60.0, 65.0, 70.0, 90.0])  # copies spread over mini-batches: not a multiple of kept
    steps = pd.DataFrame({"rollouts_sampled": [128.0] * 4, "rollouts_kept": kept, "update_rows": update_rows,
                          "time_generate": [1.0] * 4, "time_logprob": 0.01 * kept, "time_update": 0.03 * update_rows})
    update = metrics.phase_costs(steps).set_index("phase").loc["update"]
    assert update["count"] == "update_rows" and update["fixed"] == pytest.approx(0.0, abs=1e-12)
    assert update["per_rollout"] == pytest.approx(0.03) and update["r2"] == pytest.approx(1.0)
    for older in (steps.drop(columns="update_rows"), steps.assign(update_rows=math.nan)):
        update = metrics.phase_costs(older).set_index("phase").loc["update"]
        assert update["count"] == "rollouts_kept" and update["r2"] < 0.5 and update["fixed"] > 1.0


def test_step_ceilings_by_hand():
    """1 s steps, 40 kept rows at 2 + 3 ms, 128 sampled at 4 ms: keeping none saves 0.2 s (1.25×); a 2.5× step
    (0.4 s) needs 0.4 s more off generation, 100 rollouts fewer; a 10× step would need 175 fewer than 128."""
    costs = pd.DataFrame({"phase": ["generate", "logprob", "update"], "fixed": [0.1, 0.0, 0.1],
                          "per_rollout": [0.004, 0.002, 0.003],
                          "count": ["rollouts_sampled", "rollouts_kept", "rollouts_kept"]})
    counts = {"rollouts_sampled": 128, "rollouts_kept": 40}
    ceiling, left = metrics.step_ceilings(costs, 1.0, counts)
    assert ceiling == pytest.approx(1.25) and left == pytest.approx(28)
    assert metrics.step_ceilings(costs, 1.0, counts, target=10.0)[1] == pytest.approx(-47)
    # the update's seconds count its own rows: 40 kept rows through 60 update rows, 0.06 s more off a 1 s step
    ceiling, _ = metrics.step_ceilings(costs.assign(count=["rollouts_sampled", "rollouts_kept", "update_rows"]),
                                       1.0, {**counts, "update_rows": 60})
    assert ceiling == pytest.approx(1 / (1 - 0.08 - 0.18))
    # the ceiling needs only the log-prob and update lines: a generation line that does not rise with the rollouts
    # sampled (vLLM, where only FastRL pays for its sketch) leaves it standing and only the rollouts left unknown
    for generation in (math.nan, -0.001):
        ceiling, left = metrics.step_ceilings(costs.assign(per_rollout=[generation, 0.002, 0.003]), 1.0, counts)
        assert ceiling == pytest.approx(1.25) and math.isnan(left)
    unfitted = costs.assign(per_rollout=[0.004, math.nan, 0.003])
    assert all(math.isnan(v) for v in metrics.step_ceilings(unfitted, 1.0, counts))


def test_phase_shares_by_hand_and_the_papers_profile():
    """A 2 s step: generate 0.5, logprob 0.3, update 1.0, the rest 0.2 (reward 0.1, store 0.1, sketch NaN = 0): free
    passes after generation would leave 0.7 s, 2.86x; the paper's Table 8 GRPO step is 16 / 24 / 60 % with a 6.1x
    ceiling (531 s of which 87 s generation)."""
    shares = metrics.phase_shares({"generate": 0.5, "logprob": 0.3, "update": 1.0, "reward": 0.1, "store": 0.1,
                                   "sketch": math.nan})
    assert shares["generate"] == pytest.approx(0.25) and shares["logprob"] == pytest.approx(0.15)
    assert shares["update"] == pytest.approx(0.5) and shares["other"] == pytest.approx(0.1)
    assert shares["step"] == pytest.approx(2.0) and shares["ceiling"] == pytest.approx(2.0 / 0.7)
    paper = metrics.phase_shares(metrics.PAPER_STEP_SECONDS["grpo"])
    assert paper["step"] == 531 and paper["generate"] == pytest.approx(0.164, abs=1e-3)
    assert paper["logprob"] == pytest.approx(0.235, abs=1e-3) and paper["update"] == pytest.approx(0.601, abs=1e-3)
    assert paper["other"] == pytest.approx(0.0, abs=1e-12) and paper["ceiling"] == pytest.approx(531 / 87)
    assert math.isnan(metrics.phase_shares({})["generate"])


def test_phase_costs_r2_of_a_noisy_line():
    """y = 1 + 2x + e with e orthogonal to x: slope and intercept exact, r2 = 1 - var(e) / var(y)."""
    x = np.array([0.0, 1.0, 2.0, 3.0])
    noise = np.array([0.5, -0.5, -0.5, 0.5])  # zero mean, orthogonal to x
    steps = pd.DataFrame({"rollouts_sampled": x, "rollouts_kept": x, "time_generate": 1 + 2 * x + noise,
                          "time_logprob": 1 + 2 * x, "time_update": 1 + 2 * x})
    row = metrics.phase_costs(steps).set_index("phase").loc["generate"]
    y = 1 + 2 * x + noise
    assert row["fixed"] == pytest.approx(1.0) and row["per_rollout"] == pytest.approx(2.0)
    assert row["r2"] == pytest.approx(1 - noise.var() / y.var())


def _split_steps(rows):
    """Steps rows from (step, nominal, skipped, merged, pruned, kept) tuples."""
    names = ["step", "rollouts_nominal", "rollouts_skipped", "rollouts_merged", "rollouts_pruned", "rollouts_kept"]
    return pd.DataFrame(rows, columns=names)


def test_rollout_split_and_totals_by_hand():
    steps = _split_steps([(0, 16, 0, 3, 5, 8), (1, 16, 6, 2, 1, 7)])
    split = savings.rollout_split(steps)
    assert split[["nominal", "skipped", "merged", "pruned", "kept"]].values.tolist() == [[16, 0, 3, 5, 8],
                                                                                          [16, 6, 2, 1, 7]]
    assert savings.split_totals(split) == {"steps": 2, "nominal": 32, "skipped": 6, "merged": 5, "pruned": 6,
                                           "kept": 15}
    assert savings.has_split(steps) and not savings.has_split(steps.drop(columns="rollouts_merged"))
    with pytest.raises(ValueError, match="step 1: nominal 16 != skipped"):
        savings.rollout_split(_split_steps([(0, 16, 0, 3, 5, 8), (1, 16, 6, 2, 1, 6)]))
    with pytest.raises(ValueError, match="no 'rollouts_merged'"):
        savings.rollout_split(steps.drop(columns="rollouts_merged"))


def test_credited_saving_gives_the_method_only_what_grpo_did_not_also_do():
    # GRPO: 100 nominal, merged 40, kept 60. FastRL: 200 nominal (a longer run), skipped 40, merged 70, pruned 30,
    # kept 60. Shares: budget 0.2 - 0 = 0.2; rule 0.15 - 0; merge 0.35 - 0.4 = -0.05 (it merged less);
    # total 0.6 - 0.3 = 0.3 = 0.2 + 0.15 - 0.05
    grpo = {"nominal": 100, "skipped": 0, "merged": 40, "pruned": 0, "kept": 60}
    fastrl = {"nominal": 200, "skipped": 40, "merged": 70, "pruned": 30, "kept": 60}
    credit = savings.credited_saving(fastrl, grpo)
    assert credit == pytest.approx({"budget": 0.2, "rule": 0.15, "merge": -0.05, "total": 0.3})
    # the case: both merged the same duplicates, nothing else differs -> no credit at all
    same = {"nominal": 8, "skipped": 0, "merged": 4, "pruned": 0, "kept": 4}
    assert savings.credited_saving(same, same) == {"budget": 0.0, "rule": 0.0, "merge": 0.0, "total": 0.0}
    assert math.isnan(savings.credited_saving({**same, "nominal": 0}, same)["budget"])


def test_passes_after_pruning_names_only_the_passes_that_ran():
    ran = pd.DataFrame({"time_logprob": [0.5, 0.25], "time_update": [1.0, 1.0]})
    assert savings.passes_after_pruning(ran, {"objective_args": {"beta": 0.01}, "recompute_old_logprobs": False}) \
        == ["reference log-prob pass", "update"]
    assert savings.passes_after_pruning(ran, {"objective_args": {}, "recompute_old_logprobs": True}) \
        == ["old log-prob pass", "update"]
    none = pd.DataFrame({"time_logprob": [0.0, None], "time_update": [1.0, 1.0]})
    assert savings.passes_after_pruning(none, {"objective_args": {"beta": 0.01}}) == ["update"]


def test_a_seed_counts_once_however_many_runs_it_has():
    """Two runs of GRPO seed 0 (the demo run twice into one store) are one seed: the newest is counted."""
    labels = pd.DataFrame({"run_id": ["g0-old", "g0-new", "g1", "f0"], "method": ["grpo", "grpo", "grpo", "fastrl"],
                           "seed": [0, 0, 1, 0], "objective": "grpo", "is_baseline": [True, True, True, False]})
    started = pd.Series(pd.to_datetime(["2026-12-01", "2026-12-02", "2026-11-30", "2026-12-01"], utc=True),
                        index=["g0-old", "g0-new", "g1", "f0"])
    kept, left_out = metrics.one_run_per_seed(labels, started)
    assert kept["run_id"].tolist() == ["g0-new", "g1", "f0"]  # in the order given
    assert left_out[["run_id", "counted"]].values.tolist() == [["g0-old", "g0-new"]]
    assert metrics.one_run_per_seed(kept, started)[1].empty


def test_compare_runs_against_a_named_baseline():
    """baseline='grpo_unmerged': every run is paired with GRPO as TRL runs it (its target, its seeds), and a name
    with no plain-GRPO run is refused."""
    labels, steps, evals = designed()
    twin = labels[labels["method"] == "grpo"].assign(
        method="grpo_unmerged", run_id=lambda f: f["run_id"].str.replace("grpo", "grpo_unmerged"))
    slower = steps[steps["run_id"].str.startswith("grpo")].assign(
        run_id=lambda f: f["run_id"].str.replace("grpo", "grpo_unmerged"), wall_time=lambda f: f["wall_time"] * 2)
    same_evals = evals[evals["run_id"].str.startswith("grpo")].assign(
        run_id=lambda f: f["run_id"].str.replace("grpo", "grpo_unmerged"), wall_time=lambda f: f["wall_time"] * 2)
    labels, steps, evals = (pd.concat([a, b], ignore_index=True) for a, b in
                            ((labels, twin), (steps, slower), (evals, same_evals)))
    default = metrics.compare_runs(labels, steps, evals).set_index("run_id")
    unmerged = metrics.compare_runs(labels, steps, evals, baseline="grpo_unmerged").set_index("run_id")
    assert set(default["baseline_method"]) == {"grpo"} and set(unmerged["baseline_method"]) == {"grpo_unmerged"}
    # the same accuracies at twice the seconds: every step speed-up doubles, grpo's own is 2x
    assert unmerged.loc["fastrl-0", "step_speedup"] == pytest.approx(2 * default.loc["fastrl-0", "step_speedup"])
    assert unmerged.loc["grpo-0", "step_speedup"] == pytest.approx(2.0)
    assert unmerged.loc["fastrl-0", "target_speedup"] == pytest.approx(16.0)  # 8 s against 0.5 s
    with pytest.raises(ValueError, match="baseline 'cppo'"):
        metrics.compare_runs(labels, steps, evals, baseline="cppo")


def test_start_disagreements_name_the_seed_whose_runs_start_apart():
    """Every method of a seed starts from one policy: equal step-0 accuracies say nothing; a run that evaluated
    other weights (0.219 against 0.273, as an engine serving the wrong weights gave) is named with its seed."""
    per_run = pd.DataFrame({"seed": [0, 0, 0, 1, 1], "method": ["grpo", "grpo_unmerged", "fastrl", "grpo", "fastrl"],
                            "initial_accuracy": [0.2734, 0.21875, 0.21875, 0.3164, 0.3164]})
    (line,) = metrics.start_disagreements(per_run)
    assert line.startswith("seed 0:") and "grpo_unmerged 0.2188" in line and "grpo 0.2734" in line
    assert metrics.start_disagreements(per_run[per_run["seed"] == 1]) == []
