"""Is merging identical answers exact with several PPO updates a step? One GRPO step through `fastrl train`, with
and without merging, and the distance between the two policies after it.

    .venv/bin/python scripts/check_merge.py [--updates 4] [--seed 3] [--config embedded]

Runs `fastrl train CONFIG steps=1 pruner=none budget=fixed updates_per_step=U seed=S merge_duplicates=...` three
times (unmerged; merged, merge_scope=minibatch, the default; merged, merge_scope=step, the lumped merge) into a
temporary store, loads each run's final checkpoint and prints

    ||theta_merged - theta_unmerged|| / ||theta_unmerged - theta_start||

for each merge, with the rows each run sent through the update (the saving that merging keeps). Exit 1 if the
default merge is farther than 1e-3 of the update from the unmerged step.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TOLERANCE = 1e-3  # of the update's norm: issue 54's bar for "the same policy"


def _train(store: Path, config: str, overrides: list[str]) -> tuple[dict, dict]:
    """Run `fastrl train` into `store`; the run's final policy parameters and its step row."""
    from fastrl_core.checkpoints import find_latest, root
    from fastrl_core.policy import load_policy
    from fastrl_core.store import list_runs, read_steps

    command = [str(Path(sys.executable).with_name("fastrl")), "train", config, f"store_dir={store}", "steps=1",
               "checkpoint_every=0", "eval_every=0", *overrides]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    (run_id,) = list_runs(store)
    folder = find_latest(root(store, run_id))
    params = {name: value.detach().clone() for name, value in load_policy(str(folder / "policy")).model.named_parameters()}
    return params, read_steps(store, run_id).iloc[0].to_dict()


def _distance(a: dict, b: dict) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]).double() ** 2).sum() for k in a)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="embedded")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    from fastrl_core.named_models import model_path
    from fastrl_core.policy import load_policy
    from fastrl_core.run_config import load_config

    common = ["pruner=none", "budget=fixed", f"updates_per_step={args.updates}", f"seed={args.seed}"]
    logging.disable(logging.WARNING)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    start_model = load_policy(model_path(load_config(args.config, common).model)).model
    start = {name: value.detach().clone() for name, value in start_model.named_parameters()}
    with tempfile.TemporaryDirectory() as folder:
        plain, plain_row = _train(Path(folder) / "unmerged", args.config, [*common, "merge_duplicates=false"])
        update = _distance(plain, start)
        print(f"{args.config}, seed {args.seed}, {args.updates} updates a step; the unmerged step moved the policy "
              f"by {update:.4g} and sent {int(plain_row['update_rows'])} rows through the update")
        worst = 0.0
        for scope in ("minibatch", "step"):
            merged, row = _train(Path(folder) / scope, args.config,
                                 [*common, "merge_duplicates=true", f"merge_scope={scope}"])
            gap = _distance(merged, plain) / update
            worst = gap if scope == "minibatch" else worst
            print(f"  merge_scope={scope:9s}: ||merged - unmerged|| / update = {gap:.2e}; "
                  f"{int(row['update_rows'])} rows through the update, {int(row['rollouts_kept'])} through the "
                  f"log-prob passes")
    ok = worst <= TOLERANCE
    print(f"exact: merge_scope=minibatch within {TOLERANCE:g} of the update" if ok
          else f"NOT exact: merge_scope=minibatch is {worst:.2e} of the update away (> {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
