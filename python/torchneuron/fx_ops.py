"""The vocabulary of aten FX graphs the compiler path shares: an op's name
as the IR spells it, the user's source line of a node, and the sets of ops
it treats alike (random ops, views of their input's bytes, layout views)."""

import re
import sys

import torch

from . import _C

# Ops whose .Tensor overload is not their default's tensor-operand form:
# clamp.Tensor takes tensor bounds, which the device's clamp does not.
_TENSOR_OVERLOAD_KEPT = frozenset({"clamp", "clamp_min", "clamp_max"})


# The op sets below come from the native op table's traits
# (compiler/include/neuron/compiler/native_ops.h, OpTrait), defined there once.

# Ops that draw random bits (each a stream of the run's dropout seed).
_RANDOM = frozenset(_C._native_ops_with("random"))


def _op_name(target):
    """aten.mm for aten.mm.default; the overload kept where it matters
    (aten.sum.dim_IntList, aten.clamp.Tensor), dropped for the
    tensor-operand forms (aten.add.Tensor is aten.add)."""
    packet = target._overloadpacket.__name__
    overload = target._overloadname
    space = target.namespace  # aten, or e.g. _c10d_functional
    if overload == "default" or (overload == "Tensor" and packet not in _TENSOR_OVERLOAD_KEPT):
        return f"{space}.{packet}"
    return f"{space}.{packet}.{overload}"


def _graph_kernels():
    """torchneuron.nki.graph_kernel, or None while torchneuron.nki is not
    imported (then no operator runs a kernel)."""
    return sys.modules.get("torchneuron.nki.graph_kernel")


def _kernel_of(target):
    """The torchneuron.nki kernel an operator runs (nki.as_op), or None."""
    module = _graph_kernels()
    return module.kernel_of(target) if module is not None else None


def _stack_line(node):
    """The last frame of `node`'s FX stack trace ('File "x.py", line 7, in
    f'), or ""."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else ""


def _source(node, fallback=""):
    """The user's source line of `node`: the FX stack trace's last frame;
    where there is none (Dynamo records no frames inside torch.nn's own
    modules), the module it ran in ("module layers.0.norm (LayerNorm)"),
    then `fallback`, the captured graph's first source line."""
    line = _stack_line(node)
    if line:
        return line
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return fallback
    path, cls = list(stack.values())[-1]
    path = re.sub(r"\['([^']*)'\]", r".\1", re.sub(r"^L\['[^']*'\]\.?", "", str(path)))
    kind = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    module = f"module {path.lstrip('.')} ({kind})" if path else f"module {kind}"
    return f"{module}, {fallback}" if fallback else module


# Views whose result is its input's bytes, contiguous as they are: an
# output made by a chain of them from an input or another value is made
# from that tensor in Python (a view, as eager's), not stored by the graph.
_SAME_BYTES = frozenset(_C._native_ops_with("same_bytes"))


# Views that reorder their input's dims: an output made by a chain of
# them and same-bytes views from an input is that input's view in Python
# too (a saved weight's t(), as eager saves it); the next graph reads it as
# its bytes lie (_Translation.placeholder).
_LAYOUT = frozenset(_C._native_ops_with("layout"))


def _view_of_first_arg(node, ops):
    """Whether `node` is one of the view ops `ops` of its first argument,
    its other arguments constants."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and _op_name(node.target) in ops and bool(node.args)
            and isinstance(node.args[0], torch.fx.Node)
            and not any(isinstance(a, torch.fx.Node) for a in node.args[1:])
            and not any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()))


def _same_bytes_view(node):
    """Whether `node` is a view of its first argument's bytes, in order."""
    if not _view_of_first_arg(node, _SAME_BYTES):
        return False
    if _op_name(node.target) == "aten.expand":  # only to the same shape
        source, meta = node.args[0].meta.get("tensor_meta"), node.meta.get("tensor_meta")
        return source is not None and meta is not None and source.shape == meta.shape
    return True
