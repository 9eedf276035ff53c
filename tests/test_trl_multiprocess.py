"""FastRLGRPOTrainer under a real 2-process launch: `torchrun --standalone --nproc_per_node 2`, gloo on CPU.

One launch (tiny text Qwen2 of tests/test_trl_plugin.py; beta > 0 and steps_per_generation = 2, so the deferred old
AND reference passes run) trains two runs one after the other in the same two processes:
- "flat": 2 generations of 16 rollouts (4 prompts x 4), each process holding 2 whole groups; rank 1's rollouts all
  get the same reward;
- "straddle": 2 generations of 12 rollouts (3 prompts x 4) over 6 rows per process: the middle group straddles the
  two processes (TRL's groups are consecutive rows of the gathered batch); rewards vary everywhere.
Then checks, each against what the two processes recorded:
- the keep decision every process took equals one process's `decide_global` on the same batch, assembled here
  from each process's own rows (its lm_head sketches, zero where the advantage is, its advantages and rewards),
  and TRL's advantages are group-normalised over those assembled groups (so the straddling group is one group);
- every process trains on the same number of rows, exactly its kept rows, in equal micro-batches, with the
  policy's old log-probs (from the sketch's scoring forward, or the deferred pass for rows put back);
- only rank 0 writes the store (one run per store, every rollout of both processes in it, marked finished);
- "flat": rank 1's pruner keeps nothing, yet the run ends and rank 1 trains on topped-up rows, within the launch
  timeout (a hang fails the test instead of hanging CI; without the top-up rank 1 crashes and rank 0 then fails on
  the closed gloo connection, tried);
- the run's store opens in the dashboard (Runs and Rollouts pages under AppTest).

The file is also the worker: torchrun runs it as a script (`python tests/test_trl_multiprocess.py OUT MODEL`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

REPO = Path(__file__).resolve().parent.parent
WORLD_SIZE = 2
LAUNCH_TIMEOUT_S = 300  # a deadlock between the processes fails the test here
NUM_GENERATIONS, STEPS_PER_GENERATION, MAX_STEPS = 4, 2, 4  # 2 generations of 2 optimiser steps each
GENERATIONS = MAX_STEPS // STEPS_PER_GENERATION
PER_DEVICE_BATCH = {"flat": 4, "straddle": 3}
LOCAL_ROWS = {name: batch * STEPS_PER_GENERATION for name, batch in PER_DEVICE_BATCH.items()}  # 8 and 6 rows
SCENARIOS = tuple(PER_DEVICE_BATCH)
SEED, SKETCH_DIM, KEEP_RATIO, MIN_KEEP = 0, 64, 0.5, 2
FLAT_RANK = 1  # in "flat" this process's rollouts all get reward 1, so its groups have zero advantage


def accuracy_reward(flat_rank: int | None):
    """An "accuracy" of 0 or 1 (character count mod 2) that varies inside groups, except on rank `flat_rank`, where
    every rollout gets 1. Its name makes it the store's accuracy column: the Runs page needs one (it fails on a
    run whose accuracy is NaN throughout: reported, app/views/runs.py is not this test's to change)."""

    def accuracy(completions, **kwargs):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return [1.0 if rank == flat_rank else float(len(text) % 2) for text in completions]

    return accuracy


# ---------------------------------------------------------------------------------------------- the worker
def worker(out_dir: Path, model_dir: Path) -> None:
    """One process of the launch: train each scenario, then save what it saw and decided to
    out_dir/<scenario>/rank{r}.pt."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from fastrl_core.integrations.trl import FastRLGRPOTrainer

    torch.set_num_threads(1)

    class Recording(FastRLGRPOTrainer):
        """Records each generation's local rows, the decision, and the rows and micro-batches that train."""

        generations: list[dict] = []
        micro_batches: list[int] = []

        def _decide(self, output, local_sketches, drawn):
            decision, sketches, prompts = super()._decide(output, local_sketches, drawn)
            local = output["completion_ids"].shape[0]
            rank = self.accelerator.process_index
            step = decision.step
            self.generations.append({
                "completion_ids": output["completion_ids"].cpu(), "completion_mask": output["completion_mask"].cpu(),
                "advantages": output["advantages"].reshape(local, -1)[:, 0].float().cpu(),
                "rewards": self._stash["rewards"][rank * local:(rank + 1) * local].clone(),
                "keep_mask": step.keep_mask.clone(), "scores": step.pruned.scores.clone(),
                "reasons": step.pruned.reasons.clone(), "loss_weights": decision.loss_weights.clone(),
                "keep": decision.keep.clone(), "topped_up": decision.topped_up.clone(), "sketches": sketches.clone(),
                "local_sketches": local_sketches.cpu(),
                # the budget: the batch its sampler drew on this process and the state after this generation
                "drawn": None if drawn is None else (drawn.chosen, drawn.skipped, drawn.drawn_at),
                "budget_state": json.dumps(self.fastrl_budget_state, sort_keys=True)})
            return decision, sketches, prompts

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                # the old log-probs (scoring forward where it covered a row, the deferred pass elsewhere) are the
                # policy's: nothing has been updated since this generation was sampled
                ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
                mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
                with torch.no_grad():
                    fresh, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                        self, self.model, ids, mask, output["completion_ids"].shape[1])
                valid = output["completion_mask"].bool()
                self.generations[-1]["old_logps_gap"] = float(
                    (output["old_per_token_logps"] - fresh)[valid].abs().max())
                self.generations[-1]["trained_ids"] = output["completion_ids"].cpu()
                self.generations[-1]["trained_old_logps_finite"] = bool(
                    torch.isfinite(output["old_per_token_logps"]).all())
                self.generations[-1]["trained_ref_logps_finite"] = bool(
                    torch.isfinite(output["ref_per_token_logps"]).all())
            return output

        def _compute_loss(self, model, inputs):
            self.micro_batches.append(int(inputs["completion_ids"].shape[0]))
            return super()._compute_loss(model, inputs)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict({"prompt": [f"count {i} dots" for i in range(16)],
                                 "id": [f"p{i}" for i in range(16)], "answer": [str(i % 5) for i in range(16)]})
    for scenario in SCENARIOS:
        Recording.generations, Recording.micro_batches = [], []
        args = GRPOConfig(output_dir=str(out_dir / scenario / "trl"),
                          per_device_train_batch_size=PER_DEVICE_BATCH[scenario], num_generations=NUM_GENERATIONS,
                          steps_per_generation=STEPS_PER_GENERATION, max_completion_length=6, max_steps=MAX_STEPS,
                          beta=0.04, learning_rate=1e-3, seed=SEED, use_cpu=True, report_to=[], save_strategy="no",
                          logging_steps=1, disable_tqdm=True)
        reward = accuracy_reward(FLAT_RANK if scenario == "flat" else None)
        trainer = Recording(model=str(model_dir), reward_funcs=[reward], args=args, train_dataset=dataset,
                            processing_class=tokenizer, pruner="fastrl", keep_ratio=KEEP_RATIO, min_keep=MIN_KEEP,
                            sketch_dim=SKETCH_DIM, store_dir=str(out_dir / scenario / "store"),
                            run_name=f"trl-2proc-{scenario}")
        trainer.train()
        rank = trainer.accelerator.process_index
        torch.save({"rank": rank, "num_processes": trainer.accelerator.num_processes,
                    "distributed_type": str(trainer.accelerator.distributed_type),
                    "backend": torch.distributed.get_backend(), "has_writer": trainer._writer is not None,
                    "generations": Recording.generations, "micro_batches": Recording.micro_batches},
                   out_dir / scenario / f"rank{rank}.pt")


# ---------------------------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    """Launch the 2-process runs once; (output dir, {scenario: each rank's record in rank order})."""
    from test_trl_plugin import _tiny_model_dir

    root = tmp_path_factory.mktemp("trl_2proc")
    model_dir, _ = _tiny_model_dir(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD_SIZE}",
               __file__, str(root), str(model_dir)]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"2-process TRL run did not finish in {LAUNCH_TIMEOUT_S} s (a hang?):\n"
                    f"{(timeout.stderr or b'')[-3000:]}")
    assert done.returncode == 0, done.stderr[-5000:]
    return root, {scenario: [torch.load(root / scenario / f"rank{r}.pt", weights_only=False)
                             for r in range(WORLD_SIZE)] for scenario in SCENARIOS}


def _rows(scenario: str, rank: int) -> slice:
    """Rank `rank`'s rows of the gathered batch (process-major)."""
    return slice(rank * LOCAL_ROWS[scenario], (rank + 1) * LOCAL_ROWS[scenario])


def test_it_really_ran_as_two_gloo_processes(launched):
    _, runs = launched
    for records in runs.values():
        assert [r["rank"] for r in records] == [0, 1]
        for record in records:
            assert record["num_processes"] == WORLD_SIZE and record["backend"] == "gloo"
            assert record["distributed_type"].endswith("MULTI_CPU")
            assert len(record["generations"]) == GENERATIONS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_process_takes_the_decision_one_process_takes_on_the_same_batch(launched, scenario):
    from fastrl_core.integrations.trl import decide_global

    _, runs = launched
    for generation in range(GENERATIONS):
        seen = [record["generations"][generation] for record in runs[scenario]]
        # the global batch, assembled from each process's own rows (process-major, as TRL's gather orders it):
        # each process's lm_head sketches of its rows (zero where the advantage is)
        sketches = torch.cat([s["local_sketches"] for s in seen])
        assert sketches.shape == (WORLD_SIZE * LOCAL_ROWS[scenario], SKETCH_DIM)
        assert (sketches.abs().sum(1) > 0).tolist() == (torch.cat([s["advantages"] for s in seen]) != 0).tolist()
        advantages = torch.cat([s["advantages"] for s in seen])
        rewards = torch.cat([s["rewards"] for s in seen])
        group_ids = torch.arange(advantages.numel()) // NUM_GENERATIONS
        if scenario == "straddle":  # the setup holds: group 1 (rows 4-7) has rows on both processes
            assert set(group_ids[_rows(scenario, 0)].tolist()) & set(group_ids[_rows(scenario, 1)].tolist()) == {1}
        # TRL's advantages (grpo_trainer.py, scale_rewards="group"): (r - mean_g) / (unbiased std_g + 1e-4)
        grouped = rewards.view(-1, NUM_GENERATIONS)
        expected = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(advantages, expected.flatten())
        width = max(s["completion_ids"].shape[1] for s in seen)  # padded across processes, as the trainer gathers

        def padded(key: str) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(s[key].long(), (0, width - s[key].shape[1])) for s in seen])

        global_decision = decide_global(
            rewards=rewards, advantages=advantages, group_ids=group_ids, num_groups=int(group_ids.max()) + 1,
            completion_ids=padded("completion_ids"), completion_mask=padded("completion_mask").bool(),
            sketches=sketches, pruner="fastrl", keep_ratio=KEEP_RATIO, min_keep=MIN_KEEP, pruner_args={}, seed=SEED,
            generation=generation, num_processes=WORLD_SIZE, multiple=STEPS_PER_GENERATION,
            accuracy=(rewards > 0).float())
        decision = global_decision.step.pruned
        for s in seen:
            torch.testing.assert_close(s["sketches"], sketches, rtol=0, atol=0)
            assert torch.equal(s["keep_mask"], decision.keep_mask) and torch.equal(s["reasons"], decision.reasons)
            assert torch.equal(s["keep"], global_decision.keep) and torch.equal(s["topped_up"],
                                                                               global_decision.topped_up)
            torch.testing.assert_close(s["scores"], decision.scores, rtol=0, atol=0, equal_nan=True)
            torch.testing.assert_close(s["loss_weights"], global_decision.loss_weights, rtol=0, atol=0)
        assert decision.keep_mask[_rows(scenario, 0)].any()  # rank 0 has varied rewards: its pruner keeps some


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_budget_samples_and_updates_identically_on_every_process(launched, scenario):
    """pruner fastrl brings the adaptive budget (the default): each process's sampler drew the same prompts and
    skipped the same ones, at the same lag, and its state after every generation is the same on both."""
    from fastrl_core.store import list_runs, read_runs

    root, runs = launched
    records = runs[scenario]
    for generation in range(GENERATIONS):
        seen = [record["generations"][generation] for record in records]
        assert seen[0]["drawn"] is not None and seen[0]["drawn"] == seen[1]["drawn"]
        assert seen[0]["budget_state"] == seen[1]["budget_state"]
        assert '"controller": "adaptive"' in seen[0]["budget_state"]
    store_dir = root / scenario / "store"
    (run_id,) = list_runs(store_dir)
    assert read_runs(store_dir).set_index("run_id").loc[run_id, "budget"] == "adaptive"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_process_trains_on_its_own_kept_rows_in_equal_micro_batches(launched, scenario):
    _, runs = launched
    records = runs[scenario]
    for generation in range(GENERATIONS):
        counts = []
        for rank, record in enumerate(records):
            seen = record["generations"][generation]
            local_keep = seen["keep"][_rows(scenario, rank)]
            assert torch.equal(seen["trained_ids"], seen["completion_ids"][local_keep])  # exactly its kept rows
            assert seen["trained_old_logps_finite"] and seen["trained_ref_logps_finite"]  # deferred passes ran
            assert seen["old_logps_gap"] < 1e-4  # also on rows put back by the balance, which the sketch skipped
            counts.append(int(local_keep.sum()))
        assert len(set(counts)) == 1 and counts[0] % STEPS_PER_GENERATION == 0 and counts[0] >= STEPS_PER_GENERATION
    micro_batches = [record["micro_batches"] for record in records]
    assert micro_batches[0] == micro_batches[1] and len(micro_batches[0]) == MAX_STEPS


def test_a_process_whose_groups_are_all_pruned_trains_on_topped_up_rows(launched):
    from fastrl_core.algo.groups import Reason

    _, runs = launched
    flat = _rows("flat", FLAT_RANK)
    for seen in runs["flat"][FLAT_RANK]["generations"]:
        assert torch.all(seen["advantages"] == 0)
        assert not seen["keep_mask"][flat].any()
        assert (seen["reasons"][flat] == Reason.ZERO_ADVANTAGE.value).all()
        assert torch.equal(seen["keep"][flat], seen["topped_up"][flat]) and seen["keep"][flat].any()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_only_rank_zero_writes_the_store_and_it_holds_both_processes_rows(launched, scenario):
    from fastrl_core.store import list_runs, read_rollouts, read_runs, read_steps

    root, runs = launched
    records = runs[scenario]
    assert [record["has_writer"] for record in records] == [True, False]
    store_dir = root / scenario / "store"
    (run_id,) = list_runs(store_dir)  # a second writer would have claimed a second run id
    assert read_runs(store_dir).set_index("run_id").loc[run_id, "status"] == "finished"
    steps = read_steps(store_dir, run_id)
    rollouts = read_rollouts(store_dir, run_id)
    assert steps["step"].tolist() == list(range(GENERATIONS))
    for generation, seen in enumerate(records[0]["generations"]):
        stored = rollouts[rollouts["step"] == generation].copy()
        stored["index"] = stored["rollout_id"].str.split("-").str[1].astype(int)
        stored = stored.sort_values("index")
        assert stored["index"].tolist() == list(range(WORLD_SIZE * LOCAL_ROWS[scenario]))
        assert stored["kept"].tolist() == seen["keep"].tolist()
        assert stored["advantage"].tolist() == pytest.approx(torch.cat(
            [record["generations"][generation]["advantages"] for record in records]).tolist())
        if scenario == "flat":
            assert set(stored.loc[stored["index"] >= _rows("flat", FLAT_RANK).start, "reason"]) <= {
                "ZERO_ADVANTAGE", "TOPPED_UP"}
        assert int(steps.loc[generation, "rollouts_kept"]) == int(seen["keep"].sum())
        assert int(steps.loc[generation, "rollouts_topped_up"]) == int(seen["topped_up"].sum())


def test_the_runs_store_opens_in_the_dashboard(launched, monkeypatch):
    from streamlit.testing.v1 import AppTest

    import fastrl_app
    from fastrl_core.store import list_runs, read_rollouts

    root, _ = launched
    store_dir = root / "flat" / "store"
    (run_id,) = list_runs(store_dir)
    monkeypatch.setenv("FASTRL_STORE", str(store_dir))
    main = str(Path(fastrl_app.__file__).parent / "main.py")
    runs_page = AppTest.from_file(main, default_timeout=60)
    runs_page.query_params["view"] = "All runs"  # the Runs page's tab of every run
    runs_page.run()
    assert not runs_page.exception, [e.message for e in runs_page.exception]
    listed = runs_page.dataframe[0].value.set_index("run")
    assert listed.index.tolist() == [run_id] and listed.loc[run_id, "steps"] == GENERATIONS
    rollouts_page = AppTest.from_file(main, default_timeout=60)
    for key, value in {"run": run_id, "step": "1", "prompt": "all"}.items():
        rollouts_page.query_params[key] = value
    rollouts_page.switch_page("views/rollouts.py")
    rollouts_page.run()
    assert not rollouts_page.exception, [e.message for e in rollouts_page.exception]
    assert len(rollouts_page.dataframe[0].value) == len(read_rollouts(store_dir, run_id, step=1))


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
