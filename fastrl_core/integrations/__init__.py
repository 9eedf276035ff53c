"""FastRL inside other training engines.

`fastrl_core.integrations.trl`: `FastRLGRPOTrainer`, TRL's `GRPOTrainer` with FastRL pruning and the run store in
its generation-and-scoring step, so multi-GPU / multi-node training runs with `accelerate launch` (docs/gpu.md).
Import it from its module: TRL is the optional `trl` extra and is not imported here.
"""
