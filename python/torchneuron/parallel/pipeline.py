"""Pipeline parallelism: a model's layers split into stages over the
pipeline-parallel group, microbatches scheduled GPipe, 1F1B or interleaved
1F1B (neuron::parallel::MakeSchedule, C++), activations and gradients sent
between stages with headers that are checked on arrival (C++).

    layers = model.stages()                              # a flat list of modules
    chunks = partition(layers, chunks_per_stage=1)       # this rank's model chunks
    engine = PipelineEngine(chunks, loss_fn, microbatches=8, schedule="1f1b")
    loss = engine.step(tokens, targets)                  # last stage: the batch's loss

Modelled time: each chunk's forward and backward (twice the forward) are
charged to the rank's simulated compute clock from the device model (the
matmuls of its Linear layers at the microbatch's token count), unless the
chunks are compiled (charge_compute=False) or a cost function is given; the
receives join the clocks, so idle time waiting for other stages, the
bubble, shows in the modelled step time. step() records the measured
bubble next to the schedule's and the formula's.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from .. import _C
from . import mesh
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear


def _pipeline_group(group):
    if group is not None:
        return group
    return mesh.get_pipeline_parallel_group() if mesh.is_initialized() else None


def parameter_costs(layers):
    return [float(sum(p.numel() for p in layer.parameters())) or 1.0 for layer in layers]


def partition(layers, chunks_per_stage=1, group=None, costs=None):
    """This rank's model chunks: `layers` split into stages x chunks_per_stage
    contiguous parts balanced by `costs` (default: parameter counts); chunk c
    of pipeline rank s is part c * stages + s. Returns a list of
    nn.Sequential."""
    group = _pipeline_group(group)
    p = dist.get_world_size(group) if group is not None else 1
    s = dist.get_rank(group) if group is not None else 0
    layers = list(layers)
    parts = p * chunks_per_stage
    starts = _C._balanced_partition(costs or parameter_costs(layers), parts)
    return [nn.Sequential(*layers[starts[c * p + s]:starts[c * p + s + 1]])
            for c in range(chunks_per_stage)]


def _linear_shapes(module):
    """(in, out, fp32) of each Linear layer, this rank's part of split ones
    (from the layers' sizes: ZeRO-3 may have freed the weights)."""
    from .tensor_parallel import _size_rank
    for m in module.modules():
        fp32 = getattr(m, "weight", None) is None or m.weight.dtype == torch.float32
        if isinstance(m, nn.Linear):
            yield m.in_features, m.out_features, fp32
        elif isinstance(m, ColumnParallelLinear):
            t = _size_rank(m.group)[0]
            yield m.in_features, -(-m.out_features // t), fp32
        elif isinstance(m, RowParallelLinear):
            yield m.in_features // _size_rank(m.group)[0], m.out_features, fp32


def device_forward_us(chunk, x):
    """The device model's forward time of `chunk` on input `x`: its Linear
    layers' matmuls at x's token count (rows of the last dim, or token ids)."""
    tokens = x.numel() // x.shape[-1] if x.is_floating_point() else x.numel()
    return sum(_C._matmul_us(tokens, k, n, fp32) for k, n, fp32 in _linear_shapes(chunk))


class PipelineEngine:
    """Runs this rank's chunks of a pipeline over `group` (default:
    torchneuron.parallel's pipeline group).

    loss_fn(output, targets) -> mean loss of a microbatch, on the last stage.
    step(inputs, targets): inputs on the first stage, targets on the last
    (others may pass None), split into `microbatches` along `batch_dim`
    (any count; sizes may differ by one). Runs every forward and backward
    of the schedule; gradients accumulate in the chunks' parameters, scaled
    so they are the gradient of the whole batch's mean loss. Returns that
    loss on the last stage, None elsewhere.
    """

    def __init__(self, chunks, loss_fn, microbatches, schedule="1f1b", group=None,
                 batch_dim=0, cost_fn=device_forward_us, charge_compute=True):
        self.chunks = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
        self.loss_fn, self.m, self.batch_dim = loss_fn, microbatches, batch_dim
        self.group = _pipeline_group(group)
        self.p = dist.get_world_size(self.group) if self.group is not None else 1
        self.s = dist.get_rank(self.group) if self.group is not None else 0
        self.v = len(self.chunks)
        if schedule != "interleaved" and self.v != 1:
            raise ValueError(f"PipelineEngine: {self.v} chunks per stage need "
                             "schedule='interleaved'")
        plan = _C._make_schedule(schedule, self.p, microbatches, self.v)
        self.schedule = schedule
        self.order = plan["order"][self.s]
        self.schedule_bubble = plan["bubble"]
        self.formula_bubble = (self.p - 1) / (self.v * microbatches + self.p - 1) \
            if self.v == 1 else (self.p - 1) / (self.v * microbatches)
        self.cost_fn = cost_fn if charge_compute else None
        self.last = {}

    @property
    def is_first(self):
        return self.s == 0

    @property
    def is_last(self):
        return self.s == self.p - 1

    def _send(self, pending, t, vs, gradient, mb):
        _C._send_stage_tensor(pending, t, self.group, vs % self.p, gradient, mb, vs)

    def step(self, inputs=None, targets=None):
        V = self.p * self.v
        clock0 = _C._clock()["compute_us"]
        charged = 0.0
        micro_in = torch.tensor_split(inputs, self.m, self.batch_dim) if self.is_first else None
        micro_t = torch.tensor_split(targets, self.m, self.batch_dim) if self.is_last else None
        total = None if targets is None else targets.shape[self.batch_dim]
        saved, pending = {}, _C._PendingSends()
        loss_sum = None
        for forward, mb, c in self.order:
            vs = c * self.p + self.s
            where = f"pipeline stage {self.s} (virtual stage {vs}), microbatch {mb}"
            if forward:
                if vs == 0:
                    x = micro_in[mb]
                else:
                    x = _C._recv_stage_tensor(self.group, (vs - 1) % self.p, False, mb, vs)
                    if x.is_floating_point():
                        x.requires_grad_(True)
                try:
                    y = self.chunks[c](x)
                except Exception as e:
                    raise type(e)(f"{where}, forward: {e}") from e
                if self.cost_fn is not None:
                    us = self.cost_fn(self.chunks[c], x)
                    _C._advance_compute(us)
                    charged += us
                if vs == V - 1:
                    weight = micro_t[mb].shape[self.batch_dim] / total
                    y = self.loss_fn(y, micro_t[mb]) * weight
                    loss_sum = y.detach() if loss_sum is None else loss_sum + y.detach()
                else:
                    self._send(pending, y, vs + 1, False, mb)
                saved[(mb, c)] = (x, y)
            else:
                x, y = saved.pop((mb, c))
                if vs == V - 1:
                    y.backward()
                else:
                    g = _C._recv_stage_tensor(self.group, (vs + 1) % self.p, True, mb, vs, y)
                    torch.autograd.backward(y, g)
                if self.cost_fn is not None:
                    us = 2 * self.cost_fn(self.chunks[c], x)
                    _C._advance_compute(us)
                    charged += us
                if vs > 0:
                    if x.grad is None:
                        raise RuntimeError(f"{where}, backward: the stage's input got no "
                                           "gradient (does the chunk use its input?)")
                    self._send(pending, x.grad, vs - 1, True, mb)
        pending.wait()
        step_us = _C._clock()["compute_us"] - clock0
        self.last = {"modelled_step_us": step_us, "compute_us": charged,
                     "bubble": 1 - charged / step_us if step_us > 0 else 0.0,
                     "schedule_bubble": self.schedule_bubble,
                     "formula_bubble": self.formula_bubble}
        return loss_sum
