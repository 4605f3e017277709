#!/usr/bin/env python3
"""Failures inside a pipeline step.

    neuronrun -n 2 tests/python/scripts/pipeline_rank_dies.py [--shape]

Default: a stage's process dies in the middle of a step (rank 1 exits with
status 7 in its second microbatch's forward) while rank 0 waits for its
gradients: the job must end at once, naming rank 1. --shape: stage 1 expects
5 input features but receives 4: the error names the stage and microbatch.
"""
import sys
import datetime
import os

import torch
import torch.distributed as dist

import torchneuron  # noqa: F401
import torchneuron.parallel as parallel


class Dies(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            os._exit(7)
        return self.lin(x)


dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
parallel.initialize(pp=2)
if dist.get_rank() == 0:
    chunk = torch.nn.Linear(4, 4)
else:
    chunk = torch.nn.Linear(5, 4) if "--shape" in sys.argv else Dies()
engine = parallel.PipelineEngine([chunk], lambda y, t: (y - t).pow(2).mean(), microbatches=4)
engine.step(torch.randn(8, 4), torch.randn(8, 4))
print("unreachable: the step finished", flush=True)
