"""The FastRL algorithm as pure functions over tensors and plain scalars.

Modules here import only torch and the standard library: no store, app, transformers or vLLM
(`tests/test_core_imports.py` checks it). Randomness comes only from a passed `torch.Generator`.

- `objectives`: policy losses (GRPO, DAPO, GSPO, Dr.GRPO) chosen by name.
- `advantages`: group advantages for groups of unequal size.
- `sketches`: fixed-size gradient sketches per rollout.
- `groups`: the pruning data (`GroupBatch`, `PruneResult`, `Reason`) and the padded (G, M) group layout.
- `pruners`: the pruner interface, the registry of every pruner and the simple baselines (none, dapo_filter,
  cppo, pods); the shipped rule in `fastrl` (its coreset in `coreset`), the paper's and the authors' in
  `paper_pruners`.
- `duplicates`: the exact merge of identical completions.
- `costs`: how many rollouts to keep so that kept signal per second of a step is largest (from pass costs).
- `budgets`: rollouts per prompt at each step.
- `minibatches`: how a step's kept rollouts split into PPO mini-batches (several updates per step).
- `numerics`: thresholds shared with the store (`ZERO_STD`).
"""
