"""A short real training run on the embedded default, exact resume, and the trainer's use of its engine: synced
at start (after a checkpoint is loaded) and after each update, used for evaluation, and dr_grpo's normaliser."""

import collections
import copy
import dataclasses

import pytest
import torch

import fastrl_core.trainer as trainer_module
from fastrl_core.config import ConfigError
from fastrl_core.engines.base import Engine
from fastrl_core.engines.hf import HFEngine
from fastrl_core.run_config import load_config
from fastrl_core.run_setup import load_datasets
from fastrl_core.store import read_evals, read_rollouts, read_runs, read_steps
from fastrl_core.trainer import PromptSampler, Trainer


def _config(store, **overrides):
    base = {"store_dir": str(store), "steps": 3, "prompts_per_step": 8, "rollouts_per_prompt": 6,
            "eval_every": 0, "checkpoint_every": 0, "threads": 1, "synthetic_train": 256, "synthetic_test": 32,
            "eval_size": 32, "lr": 5e-4, "warmup_steps": 1}
    base.update(overrides)
    return load_config("embedded", [f"{k}={v}" for k, v in base.items()])


def test_the_trainer_computes_the_sketch_its_config_resolved_and_resolves_nothing_again(tmp_path):
    """The RunConfig's sketch_kind is what the trainer computes: changed by hand (no sketch for cppo), the trainer
    follows it instead of deciding again."""
    import dataclasses

    config = _config(tmp_path, steps=1, pruner="cppo", budget="fixed", sketch_dim=16)
    assert config.sketch_kind is None
    sketched = Trainer(dataclasses.replace(config, sketch_kind="tokens"), progress=False)
    sketched.train_step()
    sketched.writer.finish()
    sketches = read_rollouts(tmp_path, sketched.writer.run_id, columns=["sketch"])["sketch"]
    assert sketches.notna().all() and len(sketches.iloc[0]) == 16


def _params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_short_run_updates_the_policy_and_records_kept_and_pruned(tmp_path):
    trainer = Trainer(_config(tmp_path, eval_every=3), progress=False)
    before = _params(trainer.policy.model)
    run_id = trainer.run()
    after = _params(trainer.policy.model)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"

    steps = read_steps(tmp_path, run_id)
    assert steps["step"].tolist() == [0, 1, 2]
    assert (steps["rollouts_kept"] <= steps["rollouts_sampled"]).all()
    rollouts = read_rollouts(tmp_path, run_id)
    assert len(rollouts) == steps["rollouts_sampled"].sum()
    assert rollouts["kept"].any() and (~rollouts["kept"]).any(), "expected both kept and pruned rollouts"
    assert set(rollouts.loc[~rollouts["kept"], "reason"]) - {"KEPT"}
    assert (rollouts.loc[rollouts["advantage"] == 0, "kept"] == False).all()  # noqa: E712 zero-advantage pruned
    runs = read_runs(tmp_path)
    assert runs.set_index("run_id").loc[run_id, "status"] == "finished"


def test_resume_continues_exactly(tmp_path):
    straight = Trainer(_config(tmp_path / "a", steps=4), progress=False)
    straight.run()

    first = Trainer(_config(tmp_path / "b", steps=4), progress=False)
    first.train_step()
    first.train_step()
    first.save_checkpoint()
    first.writer.close()  # one writer per run: it lets go, as if killed
    resumed = Trainer(_config(tmp_path / "b", steps=4), resume=first.writer.run_id, progress=False)
    assert resumed.step == 2
    resumed.run()

    a, b = _params(straight.policy.model), _params(resumed.policy.model)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    assert straight.budget_state == resumed.budget_state
    steps_a = read_steps(tmp_path / "a", straight.writer.run_id)
    steps_b = read_steps(tmp_path / "b", resumed.writer.run_id)
    assert steps_a["reward_mean"].tolist() == pytest.approx(steps_b["reward_mean"].tolist())


def test_resample_draws_other_rollouts_for_the_same_prompts(tmp_path):
    """`resample` changes the rollouts' random stream only: same prompts, other samples; 0 is the seed's own."""
    def first_step(name, **overrides):
        trainer = Trainer(_config(tmp_path / name, steps=1, **overrides), progress=False)
        trainer.train_step()
        trainer.writer.finish()
        return read_rollouts(tmp_path / name, trainer.writer.run_id).sort_values("rollout_id")

    own, again, other = first_step("own"), first_step("again", resample=0), first_step("other", resample=1)
    assert own["completion"].tolist() == again["completion"].tolist()
    assert sorted(set(own["prompt_id"])) == sorted(set(other["prompt_id"]))
    assert own["completion"].tolist() != other["completion"].tolist()


def test_prompt_sampler_is_a_permutation_per_epoch():
    sampler = PromptSampler(10, 3, seed=1)
    seen = [i for step in range(3) for i in sampler.window(3 * step, 3)]
    assert len(set(seen)) == 9
    assert sampler.ends_epoch(3 * 3) and not sampler.ends_epoch(2 * 3)
    with pytest.raises(ValueError, match="fewer than prompts_per_step"):
        PromptSampler(2, 3, seed=0)


def test_prompt_stream_windows_match_the_steps_and_stop_at_the_epoch_end():
    """Without filling, step s reads what the sampler gave step s before the stream existed (so older runs and
    benches repeat): epoch s // 3's permutation, seeded seed·7919 + epoch, entries [(s mod 3)·3, +3)."""
    sampler = PromptSampler(10, 3, seed=1)  # epochs of 9 stream positions: the 10th problem is left out
    for step in range(7):
        epoch, within = divmod(step, 3)
        order = torch.randperm(10, generator=torch.Generator().manual_seed(1 * 7919 + epoch)).tolist()
        assert sampler.window(3 * step, 3) == order[3 * within : 3 * within + 3]
    assert sampler.window(9, 3) != sampler.window(0, 3)
    assert sampler.window(7, 5) == sampler.window(0, 9)[7:]  # cut at the epoch's end, not wrapped into the next
    assert [sampler.ends_epoch(stop) for stop in (0, 8, 9, 17, 18)] == [False, False, True, False, True]
    assert [sampler.advance(0, 3), sampler.advance(0, 5), sampler.advance(0, 7), sampler.advance(3, 6)] == [3, 5, 9, 9]


class SnapshotEngine:
    """An `Engine` that, like vLLM, samples from its own copy of the weights: an `HFEngine` on a deep copy of the
    policy's model, refreshed only by `sync_weights`; `token_logprobs` scores with the model it is given, as
    VLLMEngine's HF scorer does. Records its syncs and the problems it decoded greedily."""

    def __init__(self, config, policy, projection) -> None:
        self.own = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
        self.sampler = HFEngine(self.own, template=config.template, max_new_tokens=config.max_new_tokens,
                                temperature=config.temperature, sketch_projection=projection,
                                sketch_top_k=config.sketch_top_k or None)
        self.syncs = 0
        self.greedy_problems: list[str] = []

    def generate(self, problems, rollouts_per_prompt, *, generator=None):
        return self.sampler.generate(problems, rollouts_per_prompt, generator=generator)

    def token_logprobs(self, model, problems, rollouts, index):
        return self.sampler.token_logprobs(model, problems, rollouts, index)

    def greedy(self, problems, *, batch_size=64):
        self.greedy_problems += [problem.id for problem in problems]
        return self.sampler.greedy(problems, batch_size=batch_size)

    def sync_weights(self, model) -> None:
        self.own.model.load_state_dict(model.state_dict())
        self.syncs += 1


def _assert_same_weights(model, reference: dict):
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.detach(), reference[name], rtol=0, atol=0, msg=name)


def test_an_engine_with_its_own_weights_is_synced_after_each_update_and_after_resuming(tmp_path):
    config = _config(tmp_path, steps=2, prompts_per_step=4, rollouts_per_prompt=4)
    first = Trainer(config, progress=False, engine_factory=SnapshotEngine)
    assert isinstance(first.engine, Engine) and first.engine.syncs == 1  # at start
    initial = _params(first.policy.model)
    row = first.train_step()
    assert row["rollouts_kept"] > 0, "no update ran: nothing to sync"
    assert first.engine.syncs == 2
    trained = _params(first.policy.model)
    assert any(not torch.equal(initial[k], trained[k]) for k in trained)
    _assert_same_weights(first.engine.own.model, trained)  # the next step samples from the updated policy
    first.save_checkpoint()
    first.writer.close()  # one writer per run: it lets go, as if killed

    resumed = Trainer(config, resume=first.writer.run_id, progress=False, engine_factory=SnapshotEngine)
    assert resumed.step == 1
    _assert_same_weights(resumed.engine.own.model, trained)  # not the initial weights it was built from


def test_evaluation_decodes_with_the_runs_engine_at_its_max_new_tokens(tmp_path):
    trainer = Trainer(_config(tmp_path, max_new_tokens=2, eval_size=8), progress=False, engine_factory=SnapshotEngine)
    result = trainer.evaluate()
    assert trainer.engine.greedy_problems == [problem.id for problem in trainer.test_set]
    tokenizer = trainer.policy.tokenizer
    lengths = [len(tokenizer(text, add_special_tokens=False).input_ids) for text in result["completions"]]
    assert result["n"] == 8 and max(lengths) <= 2


def test_dr_grpo_normalises_by_the_generation_limit(tmp_path, monkeypatch):
    calls = []

    def recording_loss(name, *args, **kwargs):
        calls.append((name, args[-1].shape[1], kwargs.get("max_length")))  # args[-1]: the (n, T) mask
        return real_loss(name, *args, **kwargs)

    real_loss = trainer_module.policy_loss
    monkeypatch.setattr(trainer_module, "policy_loss", recording_loss)
    trainer = Trainer(_config(tmp_path, objective="dr_grpo", advantage="mean_only", steps=1, prompts_per_step=4,
                              rollouts_per_prompt=4, max_new_tokens=48), progress=False)
    trainer.train_step()
    ((name, padded_length, max_length),) = calls
    assert name == "dr_grpo" and max_length == 48
    assert padded_length < 48  # so the step's padded length would have been a different normaliser


# ---- PPO mini-batches (updates_per_step, minibatch_mode) and the paper regime ---------------------------------------

def test_one_update_per_step_is_the_single_update_over_every_kept_rollout(tmp_path, monkeypatch):
    """updates_per_step=1 is bit-for-bit one AdamW step on the loss over all kept rollouts (the one-update trainer)."""
    import copy

    import fastrl_core.trainer as trainer_module
    from fastrl_core.algo.objectives import policy_loss

    trainer = Trainer(_config(tmp_path, steps=1, updates_per_step=1, warmup_steps=1, merge_duplicates=False,
                              **{"objective_args.beta": 0.01}), progress=False)  # merging: tests/test_duplicates.py
    seen = {}
    real_generate, real_decide = trainer.engine.generate, trainer_module.decide_step
    monkeypatch.setattr(trainer.engine, "generate", lambda *a, **k: seen.setdefault("rollouts", real_generate(*a, **k)))

    def recording_decide(*args, **kwargs):  # the step's decision (algo.decide): its prune result and advantages
        decided = real_decide(*args, **kwargs)
        seen.update(decision=decided.pruned, advantages=decided.advantages)
        return decided

    monkeypatch.setattr(trainer_module, "decide_step", recording_decide)
    model = copy.deepcopy(trainer.policy.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=trainer.config.lr, weight_decay=trainer.config.weight_decay)
    row = trainer.train_step()

    rollouts, decision = seen["rollouts"], seen["decision"]
    problems = [trainer.train_set[i] for i in trainer.sampler.window(0, trainer.config.prompts_per_step)]
    kept = decision.keep_mask.nonzero().squeeze(1)
    with torch.no_grad():
        ref = trainer.engine.token_logprobs(trainer.reference, problems, rollouts, kept)
    model.train()
    out = policy_loss("grpo", trainer.engine.token_logprobs(model, problems, rollouts, kept),
                      rollouts.behaviour_logprobs[kept], seen["advantages"][kept], rollouts.completion_mask[kept],
                      ref_logprobs=ref, rollout_weights=decision.weights[kept], beta=0.01)
    optimizer.zero_grad()
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.config.max_grad_norm)
    optimizer.step()
    assert row["updates"] == 1 and row["loss"] == out.loss.item()
    trained = dict(trainer.policy.model.named_parameters())
    for name, expected in model.named_parameters():
        assert torch.equal(trained[name], expected), name


@pytest.mark.parametrize("mode, expected_updates", [("equal_updates", lambda kept: min(4, kept)),
                                                    ("fixed_size", lambda kept: -(-kept // 12))])
def test_several_updates_per_step_follow_the_minibatch_mode(tmp_path, monkeypatch, mode, expected_updates):
    """8 prompts x 6 rollouts = 48 per full step; 4 updates -> fixed mini-batches of 12 rows. Every mini-batch is
    scored against the behaviour log-probs (the policy before the step), so after the first update ratios leave 1."""
    import fastrl_core.trainer as trainer_module

    trainer = Trainer(_config(tmp_path, steps=1, updates_per_step=4, minibatch_mode=mode,
                              **{"objective_args.beta": 0.01}), progress=False)
    calls = []
    real_loss = trainer_module.policy_loss

    def recording_loss(name, logprobs, old_logprobs, *args, **kwargs):
        calls.append((logprobs.detach().clone(), old_logprobs.clone()))
        return real_loss(name, logprobs, old_logprobs, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", recording_loss)
    plans, real_plan = [], trainer_module.minibatch_plan
    monkeypatch.setattr(trainer_module, "minibatch_plan",
                        lambda keep_mask, **k: plans.append((keep_mask, k["representative"])) or real_plan(keep_mask, **k))
    row = trainer.train_step()
    (keep_mask, representative), = plans
    slots = int(keep_mask[representative].sum())  # the exact merge plans over every copy of a kept row
    assert row["rollouts_kept"] < slots <= row["rollouts_kept"] + row["rollouts_merged"]  # copies of pruned rows: not
    assert row["updates"] == expected_updates(slots) == len(calls) >= 2, row
    drift = [float((logprobs - old).abs().max()) for logprobs, old in calls]
    assert drift[0] < 1e-4  # first update: on-policy up to generate-vs-forward numerics (docs/notes.md §2)
    assert min(drift[1:]) > 1e-3, drift  # later ones: the policy has moved, the old log-probs have not
    # a kept row is in each mini-batch that holds one of its copies: at least once, at most once per copy
    assert row["rollouts_kept"] <= sum(len(old) for _, old in calls) == row["update_rows"] <= slots


@pytest.mark.parametrize("grouping", ["rows", "prompts"])
def test_minibatch_grouping_reaches_the_plan_as_each_rows_prompt(tmp_path, monkeypatch, grouping):
    """minibatch_grouping=prompts hands the plan each distinct row's prompt (rows of one prompt together:
    tests/test_minibatches.py), so a mini-batch holds few prompts; rows hands it none (the row shuffle)."""
    import fastrl_core.trainer as trainer_module

    trainer = Trainer(_config(tmp_path, steps=1, updates_per_step=2, pruner="none", budget="fixed",
                              minibatch_grouping=grouping), progress=False)
    seen = []
    real_plan = trainer_module.minibatch_plan
    monkeypatch.setattr(trainer_module, "minibatch_plan",
                        lambda keep_mask, **k: seen.append((keep_mask, k["groups"])) or real_plan(keep_mask, **k))
    row = trainer.train_step()
    (keep_mask, groups), = seen
    assert row["updates"] == 2
    if grouping == "rows":
        assert groups is None
        return
    assert groups.shape == keep_mask.shape and bool((groups.diff() >= 0).all())  # distinct rows, prompt-major
    assert 0 <= int(groups.min()) and int(groups.max()) < trainer.config.prompts_per_step
    assert len(groups.unique()) < len(groups)  # several rows per prompt: prompts, not row numbers


def test_resume_with_minibatches_continues_exactly(tmp_path):
    config = dict(steps=3, updates_per_step=4, **{"objective_args.beta": 0.01})
    straight = Trainer(_config(tmp_path / "a", **config), progress=False)
    straight.run()
    first = Trainer(_config(tmp_path / "b", **config), progress=False)
    first.train_step()
    first.save_checkpoint()
    first.writer.close()  # one writer per run: it lets go, as if killed
    resumed = Trainer(_config(tmp_path / "b", **config), resume=first.writer.run_id, progress=False)
    resumed.run()
    a, b = _params(straight.policy.model), _params(resumed.policy.model)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)
    steps_a = read_steps(tmp_path / "a", straight.writer.run_id)
    steps_b = read_steps(tmp_path / "b", resumed.writer.run_id)
    assert steps_a["loss"].tolist() == pytest.approx(steps_b["loss"].tolist(), abs=1e-6)


def test_paper_config_loads_and_is_the_paper_regime():
    """fastrl_core/configs/paper.yaml: every key valid (load_config rejects unknown ones) and the regime of issue 11 /
    docs/notes.md §6."""
    config = load_config("paper")
    assert config.objective_args["beta"] == 0.01  # KL as a loss term: the reference pass runs every step
    assert config.updates_per_step == 4 and config.minibatch_mode == "equal_updates"
    assert config.eval_size >= 512 and config.synthetic_test >= config.eval_size
    assert config.steps * config.prompts_per_step / config.synthetic_train >= 10  # every prompt revisited >= 10x
    assert config.steps // config.eval_every >= 8  # enough evaluations to draw a curve


def test_paper_config_trains_on_a_tiny_version(tmp_path):
    """Its pieces together (kinds subset, beta, 4 mini-batches, its warm start) for 2 small steps."""
    config = load_config("paper", [
        f"store_dir={tmp_path}", "steps=2", "prompts_per_step=4", "rollouts_per_prompt=4", "synthetic_train=16",
        "synthetic_test=8", "eval_size=8", "eval_every=2", "checkpoint_every=0", "threads=1", "pruner=none",
        "budget=fixed"])
    trainer = Trainer(config, progress=False)
    assert {p.kind for p in trainer.train_set + trainer.test_set} <= set(config.synthetic_kinds)
    assert trainer.reference is not None
    run_id = trainer.run()
    steps = read_steps(tmp_path, run_id)
    assert steps["updates"].tolist() == [min(4, k) for k in steps["rollouts_kept"]]
    assert (steps["kl"] >= 0).all() and steps["kl"].iloc[-1] > 0


def test_synthetic_kinds_and_levels_select_the_training_and_test_problems(tmp_path):
    config = _config(tmp_path, synthetic_train=24, synthetic_test=12, eval_size=12,
                     synthetic_kinds="[count_dots, parallel]", synthetic_levels="[2]")
    train_set, test_set = load_datasets(config)
    assert len(train_set) == 24 and len(test_set) == 12
    assert {(p.kind, p.level) for p in train_set} == {("count_dots", 2), ("parallel", 2)}
    assert {p.kind for p in test_set} <= {"count_dots", "parallel"} and {p.level for p in test_set} == {2}
    with pytest.raises(ConfigError, match="'triangles' is not a synthetic task kind"):  # refused at config load
        _config(tmp_path, synthetic_kinds="[triangles]")


def test_sampled_evaluation_is_recorded_per_kind_and_leaves_training_unchanged(tmp_path):
    """eval_samples = k adds split "<test_split>-sampled" (mean@k, n = problems) beside the greedy one, every row
    carries accuracy_<kind>, and the sampling draws from its own generator: the steps are those of a run without."""
    plain = Trainer(_config(tmp_path / "plain", steps=2, eval_every=1, eval_size=12), progress=False)
    sampled = Trainer(_config(tmp_path / "sampled", steps=2, eval_every=1, eval_size=12, eval_samples=3),
                      progress=False)
    runs = [plain.run(), sampled.run()]
    columns = ["reward_mean", "loss", "rollouts_kept", "accuracy"]
    first, second = (read_steps(t.config.store_dir, r)[columns] for t, r in zip((plain, sampled), runs))
    assert first.equals(second)

    evals = read_evals(tmp_path / "sampled", runs[1])
    assert sorted(set(evals["split"])) == ["test", "test-sampled"] and evals["step"].tolist() == [0, 0, 1, 1, 2, 2]
    greedy = read_evals(tmp_path / "plain", runs[0])
    assert evals[evals["split"] == "test"]["accuracy"].tolist() == greedy["accuracy"].tolist()
    kinds = collections.Counter(problem.kind for problem in sampled.test_set)
    for _, row in evals.iterrows():
        assert row["n"] == 12
        by_kind = sum(row[f"accuracy_{kind}"] * count for kind, count in kinds.items()) / 12
        assert by_kind == pytest.approx(row["accuracy"])
        sampled_share = row["accuracy"] * 12 * (3 if row["split"] == "test-sampled" else 1)
        assert sampled_share == pytest.approx(round(sampled_share))  # a count of correct completions


def test_eval_samples_without_evaluations_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="eval_samples=2 needs eval_every >= 1"):
        Trainer(_config(tmp_path, eval_samples=2), progress=False)


def test_a_measured_row_cost_is_fitted_on_the_runs_phase_times_recorded_and_kept_across_resume(tmp_path):
    from fastrl_core.algo.costs import MIN_FIT_STEPS

    config = _config(tmp_path, steps=8, keep_ratio=1.0, row_cost="measured")
    trainer = Trainer(config, progress=False)
    for _ in range(MIN_FIT_STEPS):
        trainer.train_step()
    steps = read_steps(tmp_path, trainer.writer.run_id)
    assert steps["row_cost"].isna().all()  # until the fit exists: the keep ratio alone
    assert [k for k, _, _ in trainer.pass_costs] == steps["rollouts_kept"].tolist()  # no copies: kept = rows
    assert all(0 < passes < step for _, passes, step in trainer.pass_costs)
    # a history whose line is known (real timings of 4 tiny steps are too noisy to fit): 5 ms a row, T0 = 0.5 s
    trainer.pass_costs = [(k, 0.05 + 0.005 * k, 0.5 + 0.005 * k) for k in (10, 20, 30, 40)]
    trainer.train_step()
    assert read_steps(tmp_path, trainer.writer.run_id)["row_cost"].iloc[-1] == pytest.approx(0.01)
    trainer.save_checkpoint()
    trainer.writer.close()  # one writer per run: it lets go, as if killed
    resumed = Trainer(config, resume=trainer.writer.run_id, progress=False)
    assert resumed.pass_costs == trainer.pass_costs and len(resumed.pass_costs) == MIN_FIT_STEPS + 1


def test_a_given_row_cost_is_reproducible_and_prunes_rows_the_keep_ratio_keeps(tmp_path):
    masks = {}
    for name, row_cost in (("a", 0.05), ("b", 0.05), ("free", None)):
        trainer = Trainer(_config(tmp_path / name, keep_ratio=1.0, row_cost="null" if row_cost is None else row_cost),
                          progress=False)
        run_id = trainer.run()
        rollouts = read_rollouts(tmp_path / name, run_id)
        masks[name] = rollouts["kept"].to_numpy()
        masks[name, 0] = rollouts.loc[rollouts["step"] == 0, "kept"].to_numpy()  # same policy in every run
        if row_cost is not None:
            assert (read_steps(tmp_path / name, run_id)["row_cost"] == row_cost).all()
    assert (masks["a"] == masks["b"]).all()
    assert masks["a", 0].sum() < masks["free", 0].sum() and not (masks["a", 0] & ~masks["free", 0]).any()


@pytest.mark.parametrize("objective", ["grpo", "dapo", "dr_grpo", "gspo", "gspo_token"])
def test_update_rows_accumulates_the_same_update_in_parts(tmp_path, objective):
    """update_rows splits each mini-batch's forward/backward into parts whose losses count the other rows as
    absent: the same loss and gradients for every objective, with the KL term and merged duplicates (float32
    summation order aside; AdamW's g / (|g| + eps) turns that into weight differences on entries whose gradient is
    ~1e-9: ~1e-6, and 1.5e-5 on one entry of 61,696 on another CPU). So the weights must agree to 1e-5 on all but
    0.1 % of entries and, on those, within AdamW's own bound of lr per update per entry."""
    runs, parts = {}, collections.Counter()
    for rows in (0, 5):
        trainer = Trainer(_config(tmp_path / str(rows), steps=1, updates_per_step=2, objective=objective,
                                  update_rows=rows, **{"objective_args.beta": 0.01}),
                          progress=False)
        score = trainer.engine.token_logprobs

        def counted(model, problems, rollouts, index, rows=rows):
            parts[rows] += torch.is_grad_enabled()
            return score(model, problems, rollouts, index)

        trainer.engine.token_logprobs = counted
        step = trainer.train_step()
        model = trainer.policy.model
        runs[rows] = (step, {name: p.grad.clone() for name, p in model.named_parameters()}, _params(model))
    assert parts[5] > parts[0] == 2  # 2 mini-batches, split into parts of <= 5 rows
    (whole, whole_grads, whole_params), (split, split_grads, split_params) = runs[0], runs[5]
    assert whole["rollouts_kept"] == split["rollouts_kept"] and whole["updates"] == split["updates"] == 2
    for key in ("loss", "kl"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    # GSPO clips a sequence's ratio at 1 +- 3e-4: after the first update, summation-order noise (~1e-6) can move a
    # sequence across that edge, so its clip fraction may differ by a sequence's share of the tokens
    assert split["clip_fraction"] == pytest.approx(whole["clip_fraction"], rel=1e-5,
                                                   abs=1e-3 if objective.startswith("gspo") else 1e-7)
    for name, grad in whole_grads.items():  # the second mini-batch's: after one AdamW step from ~equal weights
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-4, atol=1e-7)
    for name, value in whole_params.items():
        gap = (split_params[name] - value).abs()
        bound = 2 * whole["updates"] * trainer.config.lr  # either run moves an entry <= lr per AdamW update
        assert (gap > 1e-5).float().mean() <= 1e-3 and gap.max() <= bound, (name, gap.max())
