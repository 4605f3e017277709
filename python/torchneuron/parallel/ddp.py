"""Data parallelism: torchneuron's own DistributedDataParallel.

The gradient averaging is neuron::parallel::GradientReducer (C++): buckets of
25 MiB with a 1 MiB first bucket, packed in reverse parameter order; each
bucket's all-reduce starts from a hook on the gradient accumulators as soon
as its gradients are ready, overlapping the rest of the backward pass; the
averages are in .grad when backward() returns.
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import _C
from . import mesh


def _default_group():
    if mesh.is_initialized():
        return mesh.get_data_parallel_group()
    return dist.distributed_c10d._get_default_group()


class DistributedDataParallel(nn.Module):
    """Wraps `module` so that backward() averages its gradients over `process_group`.

    At construction, parameters and buffers are broadcast from the group's
    rank 0. Each forward (with grad enabled and outside no_sync()) arms the
    next backward to synchronise; with broadcast_buffers the buffers are
    broadcast from rank 0 first. The process group defaults to the
    data-parallel group of torchneuron.parallel.initialize, else the default
    group; any backend works. Arguments mirror torch's DDP: bucket_cap_mb,
    find_unused_parameters (a parameter without a gradient is otherwise an
    error naming it), gradient_as_bucket_view, broadcast_buffers.
    """

    def __init__(self, module, process_group=None, bucket_cap_mb=25,
                 find_unused_parameters=False, gradient_as_bucket_view=False,
                 broadcast_buffers=True, first_bucket_mb=1):
        super().__init__()
        self.module = module
        self.process_group = process_group if process_group is not None else _default_group()
        self.broadcast_buffers = broadcast_buffers
        self._bucket_bytes = int(bucket_cap_mb * (1 << 20))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        state = [p.detach() for p in module.parameters()] + list(module.buffers())
        if state:
            _C._broadcast_coalesced(state, self.process_group, 0, self._bucket_bytes)
        self._reducer = _C._GradientReducer(
            [p for _, p in named], self.process_group, self._bucket_bytes,
            int(first_bucket_mb * (1 << 20)), find_unused_parameters, gradient_as_bucket_view,
            [n for n, _ in named])
        self._sync = True

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                _C._broadcast_coalesced(buffers, self.process_group, 0, self._bucket_bytes)
        if torch.is_grad_enabled() and self._sync:
            self._reducer.prepare_for_backward()
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate local gradients without communicating;
        the next synchronising backward averages the accumulated sums."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def bucket_indices(self):
        """Parameter indices (among those requiring grad) of each bucket, in launch order."""
        return self._reducer.buckets()


def average_gradients(parameters, process_group=None, bucket_cap_mb=25):
    """Averages the .grad of `parameters` over `process_group` (default: the
    data-parallel group, else the default group) in place: for training
    loops without DistributedDataParallel's hooks, such as pipeline stages.
    Summed in rank order and divided by the group size; a missing .grad
    counts as zeros."""
    group = process_group if process_group is not None else _default_group()
    _C._average_gradients([p for p in parameters if p.requires_grad], group,
                          int(bucket_cap_mb * (1 << 20)))
