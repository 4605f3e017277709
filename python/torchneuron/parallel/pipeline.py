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
matmuls of its eager Linear layers at the microbatch's token count;
compiled modules charge their own plans), unless charge_compute=False or
another cost function is given; a chunk made by partition() is run and
charged a layer at a time (cost_fn(layer, x): its forward before it runs,
its backward as it begins). The receives join the clocks, so idle time
waiting for other stages, the bubble, shows in the modelled step time.
step() records the measured bubble next to the schedule's and the
formula's. In a recorded trace (torchneuron.fabric.start_trace) the
partitioned chunks mark each layer's forward and backward and the stage's
plan, so that a replay can regroup the layers into another number of
stages (docs/scaling.md, "Other pipeline sizes").
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
    costs = [float(c) for c in (costs or parameter_costs(layers))]
    starts = _C._balanced_partition(costs, parts)
    chunks = []
    for c in range(chunks_per_stage):
        chunk = nn.Sequential(*layers[starts[c * p + s]:starts[c * p + s + 1]])
        # Where the chunk sits in the model: PipelineEngine marks each
        # layer in a recorded trace, and records the plan with the costs.
        chunk._pipeline_first_layer = starts[c * p + s]
        chunk._pipeline_layer_costs = costs
        chunks.append(chunk)
    return chunks


def _gradient_bytes(module):
    return float(sum(p.numel() * p.element_size() for p in module.parameters()
                     if p.requires_grad))


def _compiled(module):
    """Whether `module` runs compiled: torch.compile's OptimizedModule, or a
    module compiled in place (nn.Module.compile)."""
    from torch._dynamo.eval_frame import OptimizedModule
    return (isinstance(module, OptimizedModule)
            or getattr(module, "_compiled_call_impl", None) is not None)


def _eager_modules(module):
    """`module` and its submodules, except those inside compiled modules
    (torch.compile, backend "neuron"): their graphs charge the device model
    themselves."""
    if _compiled(module):
        return
    yield module
    for child in module.children():
        yield from _eager_modules(child)


def _linear_shapes(module):
    """(in, out, fp32) of each Linear layer run eagerly, this rank's part of
    split ones (from the layers' sizes: ZeRO-3 may have freed the weights)."""
    from .tensor_parallel import _size_rank
    for m in _eager_modules(module):
        fp32 = getattr(m, "weight", None) is None or m.weight.dtype == torch.float32
        if isinstance(m, nn.Linear):
            yield m.in_features, m.out_features, fp32
        elif isinstance(m, ColumnParallelLinear):
            t = _size_rank(m.group)[0]
            yield m.in_features, -(-m.out_features // t), fp32
        elif isinstance(m, RowParallelLinear):
            yield m.in_features // _size_rank(m.group)[0], m.out_features, fp32


def device_forward_us(chunk, x):
    """The device model's forward time of `chunk` on input `x`: its eager
    Linear layers' matmuls at x's token count (rows of the last dim, or
    token ids); compiled modules charge their own modelled time."""
    tokens = x.numel() // x.shape[-1] if x.is_floating_point() else x.numel()
    return sum(_C._matmul_us(tokens, k, n, fp32) for k, n, fp32 in _linear_shapes(chunk))


def _partitioned(chunk):
    """Whether `chunk` is partition()'s nn.Sequential, run a layer at a time
    (not compiled as a whole, nor wrapped)."""
    return (type(chunk) is nn.Sequential and hasattr(chunk, "_pipeline_first_layer")
            and not _compiled(chunk))


class _BackwardBegins:
    """A hook on a layer's output: its gradient is there, so the layer's
    backward begins; marks it in the trace (when recorded) and charges it."""

    def __init__(self, layer, microbatch, backward_us):
        self.layer, self.microbatch, self.backward_us = layer, microbatch, backward_us

    def __call__(self, grad):
        _C._trace_layer(self.layer, False, self.microbatch, 0.0)
        if self.backward_us:
            _C._advance_compute(self.backward_us)


class PipelineEngine:
    """Runs this rank's chunks of a pipeline over `group` (default:
    torchneuron.parallel's pipeline group); the engine is C++
    (neuron::parallel::PipelineEngine), the chunks and the loss are called
    back in Python.

    loss_fn(output, targets) -> mean loss of a microbatch, on the last stage.
    step(inputs, targets): inputs on the first stage, targets on the last
    (others may pass None), split into `microbatches` along `batch_dim`
    (any count; sizes may differ by one). Runs every forward and backward
    of the schedule; gradients accumulate in the chunks' parameters, scaled
    so they are the gradient of the whole batch's mean loss. Returns that
    loss on the last stage, None elsewhere. `last` holds the step's modelled
    time, charged compute and bubble (measured, schedule's, formula's).
    """

    def __init__(self, chunks, loss_fn, microbatches, schedule="1f1b", group=None,
                 batch_dim=0, cost_fn=device_forward_us, charge_compute=True):
        self.chunks = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
        group = _pipeline_group(group)
        if group is None:
            group = dist.distributed_c10d._get_default_group()
        if schedule != "interleaved" and len(self.chunks) != 1:
            raise ValueError(f"PipelineEngine: {len(self.chunks)} chunks per stage need "
                             "schedule='interleaved'")
        self.stage, self.stages = dist.get_rank(group), dist.get_world_size(group)
        self._cost = cost_fn if charge_compute else None
        self._partitioned = [_partitioned(c) for c in self.chunks]
        cost = None  # whole chunks, charged by the C++ engine
        if self._cost is not None and not all(self._partitioned):
            cost = lambda c, x: (0.0 if self._partitioned[c]  # noqa: E731
                                 else float(self._cost(self.chunks[c], x)))
        self._engine = _C._PipelineEngine(len(self.chunks), microbatches, schedule, batch_dim,
                                          self._run_chunk, loss_fn, group, cost)
        self._plan = self._trace_plan(schedule, microbatches)
        self.last = {}

    def _trace_plan(self, schedule, microbatches):
        """What a recorded trace keeps of the plan (op_trace.proto,
        TracePipeline), when every chunk is partitioned; else None."""
        if not all(self._partitioned):
            return None
        layers = [(c, chunk._pipeline_first_layer + i, _gradient_bytes(layer))
                  for c, chunk in enumerate(self.chunks) for i, layer in enumerate(chunk)]
        return (schedule, microbatches, len(self.chunks),
                self.chunks[0]._pipeline_layer_costs, layers)

    def _run_chunk(self, c, microbatch, x):
        try:
            if not self._partitioned[c]:
                return self.chunks[c](x)
            return self._forward(self.chunks[c], microbatch, x)
        except Exception as e:
            vs = c * self.stages + self.stage
            where = f"pipeline stage {self.stage} (virtual stage {vs}), microbatch {microbatch}"
            raise type(e)(f"{where}, forward: {e}") from e

    def _forward(self, chunk, microbatch, x):
        """A partitioned chunk's forward, a layer at a time: each layer's
        forward marked in the trace and charged before it runs, its
        backward by a hook on its output."""
        tracing = _C._tracing()
        for i, layer in enumerate(chunk):
            index = chunk._pipeline_first_layer + i
            if tracing:
                _C._trace_layer(index, True, microbatch, float(x.numel() * x.element_size()))
            forward_us = float(self._cost(layer, x)) if self._cost is not None else 0.0
            if forward_us:
                _C._advance_compute(forward_us)
            y = layer(x)
            if y is x:  # its own hook, after the previous layer's
                y = y.view_as(y)
            if y.requires_grad and (tracing or forward_us):
                y.register_hook(_BackwardBegins(index, microbatch, 2 * forward_us))
            x = y
        return x

    @property
    def is_first(self):
        return self._engine.is_first

    @property
    def is_last(self):
        return self._engine.is_last

    def step(self, inputs=None, targets=None):
        if self._plan is not None:
            _C._trace_pipeline(*self._plan)
        loss = self._engine.step(inputs, targets)
        self.last = self._engine.stats()
        return loss
