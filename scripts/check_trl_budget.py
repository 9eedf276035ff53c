"""Does `FastRLGRPOTrainer` run FastRL's adaptive budget inside TRL? The check issue 52 asks a fresh checkout to show,
on the tests' tiny model (a 1-layer Qwen2 built from config, tests/test_trl_plugin.py's `_tiny_model_dir`).

    .venv/bin/python scripts/check_trl_budget.py [--steps 14]

Trains `FastRLGRPOTrainer` with its defaults (pruner fastrl, which brings budget adaptive) on 8 prompts, 4 of them
decided (every rollout rewarded 1), into a temporary store, and prints the stored run's pruner, budget and status,
and per step the rollouts nominal, sampled, skipped by the budget and kept. Exit 1 unless the run records budget
adaptive and the budget skipped some rollouts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_trl_plugin import _budget_dataset, _decided_or_varied_reward, _tiny_model_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=14, help="TRL optimiser steps (default 14)")
    options = parser.parse_args()

    from trl import GRPOConfig

    from fastrl_core.integrations.trl import FastRLGRPOTrainer
    from fastrl_core.store import list_runs, read_runs, read_steps

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fastrl-trl-budget-") as tmp:
        tmp = Path(tmp)
        model_dir, tokenizer = _tiny_model_dir(tmp)
        args = GRPOConfig(output_dir=str(tmp / "out"), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=4, max_steps=options.steps, learning_rate=1e-3, seed=0,
                          use_cpu=True, report_to=[], save_strategy="no", logging_steps=options.steps,
                          disable_tqdm=True)
        trainer = FastRLGRPOTrainer(model=str(model_dir), reward_funcs=[_decided_or_varied_reward], args=args,
                                    train_dataset=_budget_dataset(), processing_class=tokenizer,
                                    store_dir=str(tmp / "store"), run_name="check-trl-budget")
        trainer.train()
        (run_id,) = list_runs(tmp / "store")
        run = read_runs(tmp / "store").set_index("run_id").loc[run_id]
        steps = read_steps(tmp / "store", run_id).sort_values("step")
    print(f"run {run_id}: pruner {run['pruner']}, budget {run['budget']}, status {run['status']}")
    print(steps[["step", "rollouts_nominal", "rollouts_sampled", "rollouts_skipped", "rollouts_kept"]]
          .to_string(index=False))
    skipped = int(steps["rollouts_skipped"].sum())
    print(f"rollouts skipped by the budget: {skipped} of {int(steps['rollouts_nominal'].sum())} nominal")
    ok = run["budget"] == "adaptive" and skipped > 0 and run["status"] == "finished"
    print("the adaptive budget ran inside TRL" if ok else "FAILED: no adaptive budget, or nothing skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
