"""One training step's operations, captured at full size without doing the
model's arithmetic (docs/scaling.md, "Predicting a full-size job").

The model code is the decoder a real job trains (torchneuron.models.decoder)
with the project's tensor-parallel layers; it runs on fake "neuron" tensors
(torch._subclasses.FakeTensorMode: shapes, dtypes and the device, no
storage), with a CapturedGroup of the tensor-parallel size in place of a
process group. Every ATen operation the step dispatches is recorded as the
"neuron" device would run it: an operation the device has no kernel of its
own for but PyTorch implements as a composite (CompositeExplicitAutograd:
clone, _to_copy, zeros, slice_backward, ...) is recorded as the operations
that composite runs, as the device's dispatcher runs them; views and
allocations are free; each recorded operation is described as the device
describes it for its cost model (torchneuron._C._describe_op: the eager
device's own description), a copy as the device's DMA. Every
tensor-parallel collective is recorded with its kind and bytes; scaled
dot-product attention is one flash-attention kernel, forward and backward.
A Mixture of Experts' layer (models.decoder_moe) runs its routing and its
experts at capacity, and each of its exchanges over the expert-parallel
group (a CapturedGroup of the ep size) is recorded as an all-to-all on
axis "ep": dispatch and combine forward, and their gradients' in backward
(the load-balancing loss's few [tokens, experts] operations stay out of
backward: the captured backward runs from the layer's output).

A step is captured in phases, each one rank's operations in program order:
  embed_forward / embed_backward     the first pipeline stage's embedding
  layer_forward / layer_backward     one decoder layer (every layer is alike);
                                     the backward includes the recomputation
                                     that activation checkpointing asks for
  head_forward / head_backward       the last stage's norm, LM head and loss
  optimizer_<s>                      stage s's AdamW update of its shard
                                     (ZeRO-1 and up: 1/dp of its parameters),
                                     with gradient-norm clipping
Backwards are captured with the gradients already allocated (a later
microbatch of gradient accumulation), so they include the accumulation.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .. import _C
from ..models.decoder import Decoder
from ..parallel import tensor_parallel as tp

# Operations that allocate without writing, or reinterpret without copying
# (the device registers them natively, free).
_FREE = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
         "_unsafe_view", "lift_fresh"}

# The eager device's name for attention (runtime/aten op_info: kAttention).
_ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _is_view(func):
    """An op whose results alias its arguments without writing them."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


def describe(name, overload, inputs, outputs):
    """The device's cost description of one operation: a dict of op_info's
    fields, from the tensors' shapes and dtypes only."""
    shapes = lambda ts: [(list(t.shape), t.dtype) for t in ts]  # noqa: E731
    return _C._describe_op(name, overload, shapes(inputs), shapes(outputs))


class Recorder(TorchDispatchMode):
    """Records the operations dispatched inside `phase(name)`."""

    def __init__(self):
        super().__init__()
        self.phases = {}
        self._current = None
        self._paused = 0
        self._decomposing = []

    @contextlib.contextmanager
    def phase(self, name):
        self._current = self.phases.setdefault(name, [])
        try:
            yield
        finally:
            self._current = None

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _recording(self):
        return self._current is not None and not self._paused

    def add(self, entry):
        if self._recording():
            self._current.append(entry)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, _, base = func._schema.name.partition("::")
        if namespace != "aten" or base in _FREE or _is_view(func):  # prim:: ops are metadata
            return func(*args, **kwargs)
        if self._composite_on_device(func):
            self._decomposing.append(func)
            try:
                with self:  # the composite's own operations, recorded in turn
                    return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd,
                                       *args, **kwargs)
            finally:
                self._decomposing.pop()
        if base in ("_copy_from", "_copy_from_and_resize"):
            # The device's copy into `dst`: nothing to move between fake tensors
            # (FakeTensorMode has no meta kernel for it, and would run it on
            # real memory of the tensors' size).
            out = args[1]
        else:
            out = func(*args, **kwargs)
        if self._recording():
            self.add({"op": self._describe(func, base, args, kwargs, out)})
        return out

    def _composite_on_device(self, func):
        """Whether the device runs `func` as PyTorch's composite (no kernel of
        its own), and the composite does not call `func` itself."""
        name = func.name()
        return (func not in self._decomposing
                and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
                and torch._C._dispatch_has_kernel_for_dispatch_key(
                    name, "CompositeExplicitAutograd"))

    @staticmethod
    def _describe(func, base, args, kwargs, out):
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        if base == "_copy_from":  # the device's own copy: a DMA of what it writes
            op = describe("aten::_copy_from", "", inputs[:1], inputs[1:2])
            op["kind"] = "copy"
        else:
            op = describe(func._schema.name, func._schema.overload_name, inputs, outputs)
        op["name"] = f"{func._schema.name}.{func._schema.overload_name or 'default'}"
        return op

    # -- stand-ins for the tensor-parallel collectives (CapturedGroup) ------
    def collective(self, kind, x, group, *args):
        return _Collective.apply(x, self, kind, group.size, args[0] if args else -1)

    def record_collective(self, kind, nbytes, axis="tp"):
        self.add({"collective": {"kind": kind, "axis": axis, "bytes": float(nbytes)}})

    def all_to_all(self, x, group):
        """The expert-parallel exchange of equal blocks (x: (ep, rows, ...),
        block r to ep rank r): the same shape back, recorded forward and
        backward as an all-to-all of what the rank sends."""
        return _AllToAll.apply(x, self)

    def vocab_parallel_cross_entropy(self, logits, target, group, vocab):
        return _VocabParallelCrossEntropy.apply(logits, target, self, vocab, group.size)


def _nbytes(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


# Each stand-in: (forward collective, backward collective) and the output's
# shape; sizes as collective_schedules.h counts them (the per-rank buffer
# for all-reduce, the gathered total for all-gather and reduce-scatter).
class _Collective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, recorder, kind, size, dim):
        ctx.recorder, ctx.kind, ctx.size, ctx.dim = recorder, kind, size, dim
        shape = list(x.shape)
        if kind == "reduce_from":  # all-reduced in a copy, as neuron::parallel does
            x = x.contiguous().clone()
            recorder.record_collective("allreduce", _nbytes(shape, x.dtype))
            return x
        if kind == "gather_sequence":
            shape[0] *= size
            recorder.record_collective("allgather", _nbytes(shape, x.dtype))
        elif kind == "reduce_scatter_sequence":
            recorder.record_collective("reducescatter", _nbytes(shape, x.dtype))
            shape[0] //= size
        elif kind == "gather_from":
            shape[dim] *= size
            recorder.record_collective("allgather", _nbytes(shape, x.dtype))
        elif kind == "scatter_to":
            shape[dim] //= size
        with recorder.paused():
            return x.new_empty(shape)

    @staticmethod
    def backward(ctx, grad):
        recorder, kind, size, dim = ctx.recorder, ctx.kind, ctx.size, ctx.dim
        shape = list(grad.shape)
        if kind == "copy_to":
            grad = grad.contiguous().clone()
            recorder.record_collective("allreduce", _nbytes(shape, grad.dtype))
            return grad, None, None, None, None
        if kind == "gather_sequence":
            recorder.record_collective("reducescatter", _nbytes(shape, grad.dtype))
            shape[0] //= size
        elif kind == "reduce_scatter_sequence":
            shape[0] *= size
            recorder.record_collective("allgather", _nbytes(shape, grad.dtype))
        elif kind == "gather_from":
            shape[dim] //= size
        elif kind == "scatter_to":
            shape[dim] *= size
            recorder.record_collective("allgather", _nbytes(shape, grad.dtype))
        with recorder.paused():
            return grad.new_empty(shape), None, None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, recorder):
        ctx.recorder = recorder
        recorder.record_collective("alltoall", _nbytes(x.shape, x.dtype), "ep")
        with recorder.paused():
            return x.new_empty(x.shape)

    @staticmethod
    def backward(ctx, grad):
        ctx.recorder.record_collective("alltoall", _nbytes(grad.shape, grad.dtype), "ep")
        with ctx.recorder.paused():
            return grad.new_empty(grad.shape), None


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """neuron::parallel's vocab-parallel cross-entropy, operation for
    operation (parallel/src/tensor_parallel_ops.cc, VocabCrossEntropy), as
    rank 0 of the group runs it: the max, the target's logit and the sum of
    exponentials all-reduced over the group; backward is local."""

    @staticmethod
    def forward(ctx, logits, target, recorder, vocab, size):
        part = logits.shape[-1]
        x = logits.to(torch.float32)
        if part > vocab:  # rank 0's part holds padding only past the vocabulary
            x = x.clone()
            x.narrow(-1, vocab, part - vocab).fill_(float("-inf"))
        m = x.max(-1)[0]
        recorder.record_collective("allreduce", m.numel() * 4)
        x = x - m.unsqueeze(-1)
        local = target - 0
        outside = (local < 0).logical_or(local >= part)
        index = local.masked_fill(outside, 0)
        predicted = x.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        e = x.exp()
        total = e.sum(-1)
        recorder.record_collective("allreduce", predicted.numel() * 4)
        recorder.record_collective("allreduce", total.numel() * 4)
        softmax = e / total.unsqueeze(-1)
        ctx.save_for_backward(softmax, index, outside)
        ctx.dtype = logits.dtype
        return (total.log() - predicted).to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        softmax, index, outside = ctx.saved_tensors
        g = softmax.clone()
        own = outside.logical_not().to(g.dtype)
        g.scatter_add_(-1, index.unsqueeze(-1), -own.unsqueeze(-1))
        g.mul_(grad.to(g.dtype).unsqueeze(-1))
        return g.to(ctx.dtype), None, None, None, None


class _FlashAttention(torch.autograd.Function):
    """Causal attention as one kernel (Neuron's flash attention): recorded
    with the eager device's description and the dimensions its tiles run."""

    @staticmethod
    def forward(ctx, q, k, v, recorder):
        ctx.recorder = recorder
        with recorder.paused():
            out = q.new_empty(q.shape)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        _record_attention(recorder, False, [q, k, v], [out, lse])
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        with ctx.recorder.paused():
            grads = [t.new_empty(t.shape) for t in (q, k, v)]
        _record_attention(ctx.recorder, True, [grad, q, k, v, out, lse], grads)
        return grads[0], grads[1], grads[2], None


def _record_attention(recorder, backward, inputs, outputs):
    name = _ATTENTION[1 if backward else 0]
    op = describe(name, "", inputs, outputs)
    q = inputs[1] if backward else inputs[0]
    k = inputs[2] if backward else inputs[1]
    b, h, s, d = q.shape
    op["name"] = name
    op["attention"] = {"batch_heads": b * h, "query": s, "key": k.shape[2], "head_dim": d,
                       "causal": True, "backward": backward}
    recorder.add({"op": op})


@contextlib.contextmanager
def _flash_attention(recorder):
    """F.scaled_dot_product_attention as _FlashAttention (grouped-query
    attention's kv heads read in place, as the kernel reads them)."""
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        if attn_mask is not None or dropout_p or not is_causal:
            raise ValueError("predict: the captured attention is causal, without a mask "
                             "or dropout")
        return _FlashAttention.apply(q, k, v, recorder)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
