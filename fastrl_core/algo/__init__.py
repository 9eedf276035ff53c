"""The FastRL algorithm as pure functions over tensors and plain scalars.

Modules here import only torch and the standard library: no store, app, transformers or vLLM
(`tests/test_core_imports.py` checks it). Randomness comes only from a passed `torch.Generator`.

- `objectives`: policy losses (GRPO, DAPO, GSPO, Dr.GRPO) chosen by name.
- `advantages`: group advantages for groups of unequal size.
- `sketches`: fixed-size gradient sketches per rollout.
- `pruners`: keep/prune decisions per prompt group (the selections in `coreset`, `matching`, `dpp`; the paper's and
  the authors' rules in `paper_pruners`).
- `duplicates`: the exact merge of identical completions.
- `costs`: how many rollouts to keep so that kept signal per second of a step is largest (from pass costs).
- `budgets`: rollouts per prompt at each step.
- `minibatches`: how a step's kept rollouts split into PPO mini-batches (several updates per step).
"""
