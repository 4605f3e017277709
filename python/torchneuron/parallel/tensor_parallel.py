"""Tensor and sequence parallelism (Megatron-LM's layers).

Each layer keeps its slice of a weight split over the tensor-parallel group
(default: torchneuron.parallel's, else no split) and moves activations with
the autograd collectives of neuron::parallel (C++): their backward is the
collective the gradient needs. Weights are initialised in full from the
default RNG (equal on the tensor-parallel ranks: see manual_seed) and then
sliced, so a model built with tensor parallelism starts exactly where the
same model on one device starts. Every split parameter carries
`tensor_parallel_dim` (the dim it is split along) and `tensor_parallel_full`
(its unsplit, unpadded size along it).

With sequence_parallel=True, activations outside the tensor-parallel
regions are split along the sequence (dim 0, layout [sequence, batch,
hidden]): a column-parallel layer all-gathers its input and a row-parallel
layer reduce-scatters its output instead of all-reducing. LayerNorm weights
in such regions see only part of the sequence: mark them with
mark_sequence_parallel() and call allreduce_sequence_parallel_grads(model)
after backward.
"""
import contextlib
import math

import torch
import torch.nn as nn
from torch._compile import _disable_dynamo
import torch.nn.functional as F

from .. import _C
from . import mesh


def _group(group):
    """The group to split over: `group`; None: torchneuron.parallel's
    tensor-parallel group if initialized; False (returned too): none."""
    if group is not None:
        return group
    return mesh.get_tensor_parallel_group() if mesh.is_initialized() else False


def _size_rank(group):
    import torch.distributed as dist
    if group is None or group is False:
        return 1, 0
    if isinstance(group, CapturedGroup):
        return group.size, group.rank
    return dist.get_world_size(group), dist.get_rank(group)


class CapturedGroup:
    """A tensor-parallel group of `size` ranks that exists only in a capture
    (torchneuron.predict): the layers split their weights for it as for a
    real group, and each collective goes to `recorder.collective(kind, x,
    dim)`, which returns its result's shape without moving data."""

    def __init__(self, size, recorder, rank=0):
        self.size, self.rank, self.recorder = size, rank, recorder


# -- autograd collectives (no-ops without a group of several ranks) ------------
def _outside_graphs(fn):
    """`fn` kept out of torch.compile's graphs: a compiled module breaks its
    graph there and runs `fn` eagerly (Dynamo cannot trace the C++ autograd
    collectives, nor the RNG tracker's state swap). Eager code calls `fn`
    itself; Dynamo is imported only when a compiled graph first reaches it
    (torch._compile._disable_dynamo)."""
    def eager(*args):
        return fn(*args)
    disabled = _disable_dynamo(eager)

    def call(*args):
        return disabled(*args) if torch.compiler.is_compiling() else fn(*args)
    return call


def _or_captured(kind, fn):
    """`fn` (a C++ autograd collective), or for a CapturedGroup its recorder's
    stand-in of the same kind (the same shapes forward and backward)."""
    def call(x, group, *args):
        if isinstance(group, CapturedGroup):
            return group.recorder.collective(kind, x, group, *args)
        return fn(x, group, *args)
    return call


_copy_to_group = _or_captured("copy_to", _outside_graphs(_C._copy_to_group))
_reduce_from_group = _or_captured("reduce_from", _outside_graphs(_C._reduce_from_group))
_gather_from_group = _or_captured("gather_from", _outside_graphs(_C._gather_from_group))
_scatter_to_group = _or_captured("scatter_to", _outside_graphs(_C._scatter_to_group))
_reduce_scatter_sequence = _or_captured("reduce_scatter_sequence",
                                        _outside_graphs(_C._reduce_scatter_sequence))
_gather_sequence = _or_captured("gather_sequence", _outside_graphs(_C._gather_sequence))


def copy_to_tensor_parallel(x, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _copy_to_group(x, group)


def reduce_from_tensor_parallel(x, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _reduce_from_group(x, group)


def gather_from_tensor_parallel(x, dim=-1, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _gather_from_group(x, group, dim)


def scatter_to_tensor_parallel(x, dim=-1, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _scatter_to_group(x, group, dim)


def gather_from_sequence_parallel(x, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _gather_sequence(x, group)


def reduce_scatter_to_sequence_parallel(x, group=None):
    group = _group(group)
    return x if _size_rank(group)[0] == 1 else _reduce_scatter_sequence(x, group)


def vocab_parallel_cross_entropy(logits, target, vocab_size, group=None):
    """Per-token cross-entropy of logits split over the vocabulary (last dim),
    exact for a vocabulary padded to a multiple of the group size."""
    group = _group(group)
    if _size_rank(group)[0] == 1:
        return F.cross_entropy(logits[..., :vocab_size].reshape(-1, vocab_size).float(),
                               target.reshape(-1), reduction="none").view(target.shape)
    if isinstance(group, CapturedGroup):
        return group.recorder.vocab_parallel_cross_entropy(logits, target, group, vocab_size)
    return _C._vocab_parallel_cross_entropy(logits, target, group, vocab_size)


# -- initialisation ------------------------------------------------------------
def _split(full, dim, group):
    """Rank's slice of `full` along `dim`, after zero padding to a multiple of
    the group size."""
    size, rank = _size_rank(group)
    n = full.shape[dim]
    p = nn.Parameter(slice_padded(full, dim, math.ceil(n / size), rank).clone())
    p.tensor_parallel_dim, p.tensor_parallel_full = dim, n
    return p


def slice_padded(full, dim, part, index):
    """Block `index` of `part` elements along `dim` of `full`, zero-padded past
    full's end (the split of a size the group does not divide)."""
    if part * (index + 1) > full.shape[dim]:
        pad = list(full.shape)
        pad[dim] = part * (index + 1) - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad)], dim)
    return full.narrow(dim, index * part, part)


def local_part(full, param, group=None):
    """This rank's part of `full`, the unsplit value of split parameter `param`;
    `full` itself for a parameter that is not split."""
    dim = getattr(param, "tensor_parallel_dim", None)
    if dim is None:
        return full
    size, rank = _size_rank(_group(group))
    # The part's length as _split made it (the parameter itself may be empty:
    # ZeRO-3 frees it between uses).
    part = math.ceil(param.tensor_parallel_full / size)
    return slice_padded(full, dim, part, rank)


def _check_divides(what, n, group):
    size, _ = _size_rank(group)
    if n % size:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size {size}")


def _linear_init(out_features, in_features, bias):
    """nn.Linear's initialisation of the full weight and bias (same RNG draws)."""
    w = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    b = None
    if bias:
        bound = 1 / math.sqrt(in_features)
        b = torch.empty(out_features)
        nn.init.uniform_(b, -bound, bound)
    return w, b


# -- layers --------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A split along its output features: rank r computes
    output columns [r * out/t, (r+1) * out/t). gather_output all-gathers
    them (else the output stays split, for a RowParallelLinear next)."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False,
                 sequence_parallel=False, group=None, pad_output=False):
        super().__init__()
        self.group = _group(group)
        if not pad_output:
            _check_divides("ColumnParallelLinear: out_features", out_features, self.group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel
        w, b = _linear_init(out_features, in_features, bias)
        self.weight = _split(w, 0, self.group)
        self.bias = _split(b, 0, self.group) if bias else None

    def forward(self, x):
        if self.sequence_parallel and _size_rank(self.group)[0] > 1 and \
                not torch.compiler.is_compiling():
            y = _SequenceParallelLinear.apply(x, self.weight, self.bias, self.group)
        elif self.sequence_parallel:
            x = gather_from_sequence_parallel(x, self.group)
            y = F.linear(x, self.weight, self.bias)
        else:
            x = copy_to_tensor_parallel(x, self.group)
            y = F.linear(x, self.weight, self.bias)
        return gather_from_tensor_parallel(y, -1, self.group) if self.gather_output else y


class _SequenceParallelLinear(torch.autograd.Function):
    """y = all_gather(x) A^T + b keeping only the rank's sequence shard x for
    backward, which all-gathers it again (Megatron-LM's
    LinearWithGradAccumulationAndAsyncCommunication): the gathered input,
    tp times the shard, is never held between forward and backward. The
    products are the ones autograd runs for F.linear."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        with torch.no_grad():
            total = _gather_sequence(x, group)
            return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        with torch.no_grad():
            total = _gather_sequence(x, ctx.group)
            grad_total = grad.matmul(weight)
            grad_x = _reduce_scatter_sequence(grad_total, ctx.group)
            flat = grad.reshape(-1, grad.shape[-1])
            grad_weight = flat.t().matmul(total.reshape(-1, total.shape[-1]))
            grad_bias = flat.sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A split along its input features: rank r takes input
    columns [r * in/t, ...) (input_is_parallel: already split, as a
    ColumnParallelLinear leaves them) and the partial products are summed
    (all-reduce; reduce-scatter along the sequence with sequence_parallel).
    The bias is added once, after the sum."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 sequence_parallel=False, group=None):
        super().__init__()
        self.group = _group(group)
        _check_divides("RowParallelLinear: in_features", in_features, self.group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        w, b = _linear_init(out_features, in_features, bias)
        self.weight = _split(w, 1, self.group)
        self.bias = nn.Parameter(b) if bias else None
        if self.bias is not None and sequence_parallel:
            mark_sequence_parallel(self.bias, self.group)

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel(x, -1, self.group)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel(y, self.group)
        else:
            y = reduce_from_tensor_parallel(y, self.group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """An embedding whose rows (the vocabulary, padded to a multiple of the
    group size) are split over the group; tokens outside a rank's rows look
    up zeros there and the sum over ranks (all-reduce, or reduce-scatter
    along the sequence with sequence_parallel) is the full lookup."""

    def __init__(self, num_embeddings, embedding_dim, sequence_parallel=False, group=None):
        super().__init__()
        self.group = _group(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.sequence_parallel = sequence_parallel
        w = torch.empty(num_embeddings, embedding_dim)
        nn.init.normal_(w)  # nn.Embedding's initialisation
        self.weight = _split(w, 0, self.group)
        size, rank = _size_rank(self.group)
        self.part = self.weight.shape[0]
        self.begin = rank * self.part

    def forward(self, tokens):
        if _size_rank(self.group)[0] == 1:
            out = F.embedding(tokens, self.weight)
        else:
            local = tokens - self.begin
            outside = (local < 0) | (local >= self.part)
            out = F.embedding(local.masked_fill(outside, 0), self.weight)
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel(out, self.group)
        return reduce_from_tensor_parallel(out, self.group)


# -- sequence-parallel gradients ---------------------------------------------------
def mark_sequence_parallel(param, group=None):
    """Marks a parameter used on a sequence shard (LayerNorm in a
    sequence-parallel region) of `group` (None: torchneuron.parallel's
    tensor-parallel group): its gradient is summed over that group by
    allreduce_sequence_parallel_grads, or by FullyShardedDataParallel."""
    param.sequence_parallel = True
    param.sequence_parallel_group = _group(group)
    return param


def sequence_parallel_group(param):
    """The group over which `param`'s gradient must be summed (it was marked
    with mark_sequence_parallel on a group of several ranks), else None."""
    if not getattr(param, "sequence_parallel", False):
        return None
    group = param.sequence_parallel_group
    return group if _size_rank(group)[0] > 1 else None


def allreduce_sequence_parallel_grads(model, group=None):
    """Sums the gradients of marked parameters over their group (the one
    they were marked with; `group` overrides it), one coalesced all-reduce
    per group."""
    import torch.distributed as dist
    by_group = {}
    for p in model.parameters():
        if p.grad is None or not getattr(p, "sequence_parallel", False):
            continue
        g = group if group is not None else sequence_parallel_group(p)
        if g is not None and _size_rank(g)[0] > 1:
            by_group.setdefault(id(g), (g, []))[1].append(p.grad)
    for g, grads in by_group.values():
        flat = torch.cat([d.reshape(-1) for d in grads])
        dist.all_reduce(flat, group=g)
        offset = 0
        for d in grads:
            d.copy_(flat[offset:offset + d.numel()].view_as(d))
            offset += d.numel()


def sequence_parallel_dropout(x, p, training=True, group=None):
    """Dropout of a sequence shard (dim 0 of x is this rank's 1/t of the
    sequence) that drops what dropout of the whole sequence on one device
    drops: the full mask is drawn from the default RNG (equal on the
    tensor-parallel ranks, as F.dropout draws it: bernoulli(1 - p) / (1 - p))
    and this rank keeps its slice."""
    size, rank = _size_rank(_group(group))
    if not training or p == 0 or size == 1:
        return F.dropout(x, p, training)
    shape = (x.shape[0] * size,) + tuple(x.shape[1:])
    noise = torch.empty(shape, dtype=x.dtype).bernoulli_(1 - p).div_(1 - p)
    return x * noise.narrow(0, rank * x.shape[0], x.shape[0])


# -- RNG -------------------------------------------------------------------------
class RNGStatesTracker:
    """Megatron's split of randomness: the default RNG is seeded equally on the
    ranks of a tensor-parallel group (so initialisation and dropout outside
    tensor-parallel regions match one device's), while dropout inside a
    region (on a rank's own heads or columns) draws from a tensor-parallel
    RNG seeded seed + 2718 + tensor-parallel rank, entered with fork()."""

    def __init__(self):
        self.states = {}

    def add(self, name, seed):
        if name in self.states:
            raise ValueError(f"RNG state {name!r} already exists")
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name="tensor-parallel"):
        if name not in self.states:
            raise KeyError(f"RNG state {name!r} was never added (call manual_seed)")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


_tracker = RNGStatesTracker()


def _dropout_in_stream(x, p, name):
    with _tracker.fork(name):
        return F.dropout(x, p)


_dropout_in_stream_outside_graphs = _outside_graphs(_dropout_in_stream)


def tensor_parallel_dropout(x, p, name="tensor-parallel"):
    """Training-mode dropout drawn from the tracker's stream `name` (each
    tensor-parallel rank its own: its part of the heads). Under
    torch.compile a graph break: the state swap runs eagerly."""
    return _dropout_in_stream_outside_graphs(x, p, name)


def get_rng_tracker():
    return _tracker


def manual_seed(seed, group=None):
    """Seeds the default RNG with `seed` (pipeline stages should pass their own
    offset) and the tensor-parallel RNG with seed + 2718 + tensor-parallel rank."""
    _, rank = _size_rank(_group(group))
    torch.manual_seed(seed)
    _tracker.states.clear()
    _tracker.add("tensor-parallel", seed + 2718 + rank)
