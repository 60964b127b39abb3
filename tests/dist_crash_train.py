"""Run under `torchrun --nproc_per_node 2` by tests/runtime/test_distributed.py (not collected by pytest).

`mirrorbert ARGV` in which rank 1 dies (os._exit, like a crash or an OOM kill) right after its third
optimiser step; torchrun then SIGTERMs rank 0. That must end as a failure naming the last good
checkpoint, not as a preemption: the ranks can no longer agree.
"""

import os
import sys

import mirrorbert.mirror.step as trainer
from mirrorbert.cli.app import main

CRASH_AFTER_STEP = 3
real, steps = trainer.backward_and_step, []


def stepping(*args, **kwargs):
    real(*args, **kwargs)
    steps.append(1)
    if os.environ.get("RANK") == "1" and len(steps) == CRASH_AFTER_STEP:
        os._exit(3)


trainer.backward_and_step = stepping

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
