"""Named points where the fault-injection test kills the trainer (`scripts/fault_injection.py`).

`reach(name)` is a no-op unless the environment variable FASTRL_KILL_AT is `name:k`: then the k-th time (from 1)
the process reaches that point it kills itself with SIGKILL, as `kill -9` would at that instant. Only the
fault-injection test sets it; the points mark the writes a crash could tear (a step's files, an evaluation, each
stage of a checkpoint swap).
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "step.rollouts_written",  # a step's rollouts file renamed into place, its groups and steps files not yet
    "step.groups_written",  # everything but the steps file (the step not yet visible)
    "step.written",  # the steps file written: the step is visible, its evaluation / checkpoint not yet done
    "eval.written",  # an evaluation written, the checkpoint of that step not yet
    "checkpoint.policy_written",  # inside a checkpoint's temp folder: the weights written, the rest not
    "checkpoint.renamed",  # the new checkpoint folder complete and in place, the `latest` pointer still old
    "checkpoint.pointed",  # the pointer moved, the old checkpoint not yet deleted
)
_target = os.environ.get("FASTRL_KILL_AT", "")
_name, _, _count = _target.partition(":")
_left = int(_count or 1) if _name else 0


def reach(name: str) -> None:
    """Kill this process with SIGKILL if FASTRL_KILL_AT names this point and this is the chosen visit."""
    global _left
    if _left and name == _name:
        _left -= 1
        if _left == 0:
            os.kill(os.getpid(), signal.SIGKILL)
