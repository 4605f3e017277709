"""Kernel operators inside torch.compile(backend="neuron") graphs.

An operator made by nki.as_op is one node of the compiler's IR,

    %o_0: bf16[1,4,2048,64], %o_1: f32[1,4,2048] = nki.kernel(%q, %k, %v)
        {kernel = "nki::flash_attention_forward@3f1c09d2a4b7e650", time_us = 301.6,
         hbm_bytes = 6291456, busy_tensor = 143.0, busy_vector = 276.0, ...}

which the compiler lowers to one instruction over HBM buffers lasting the
kernel's modelled time for those shapes (its own list schedule) and
holding the engines it used (compiler/src/lower_custom.h). The executor
runs it by calling back into Python (the kernel on CPU tensors over the
plan's memory, torchneuron._C._nki_register_graph_kernel), so its results
are the kernel's.

The key names the operator and a digest of the kernel's source (its
function's and its module's) and of the call's non-tensor arguments: the
IR text, and so the compile cache key, changes when the kernel does. The
price comes from running the kernel once per key and input signature on
seeded random inputs of the traced shapes and dtypes: a kernel's schedule
depends on its shapes and non-tensor arguments, not on its values
(kernels are Python over shapes; values reach no control flow).
"""

import hashlib
import marshal
import inspect
import sys
import threading

import torch

from .. import _C

_OPS = {}        # "namespace::name" -> Kernel, by nki.as_op
_PRICES = {}     # (key, input signature) -> Price
_REGISTERED = {}  # key -> the kernel whose callback _C holds
_lock = threading.Lock()
_run_lock = threading.Lock()  # one kernel runs at a time (kernel.py's state is global)

# schedule.py's engines -> the IR attribute of their busy time.
_ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


class Price:
    """A kernel's modelled figures for one call signature: time_us, busy_us
    ({engine: microseconds it is busy, overlapping transfers counted once}),
    hbm_bytes."""

    def __init__(self, run):
        self.time_us = run.time_us
        self.hbm_bytes = run.hbm_bytes
        self.busy_us = {e: _covered(lst) for e, lst in run.timelines().items()}


def _covered(instructions):
    """The time the intervals of `instructions` cover (start order)."""
    total, end = 0.0, float("-inf")
    for i in instructions:
        if i.end_us <= end:
            continue
        total += i.end_us - max(i.start_us, end)
        end = i.end_us
    return total


def register_op(name, kernel):
    """Called by nki.as_op: operator `name` ("namespace::op") runs `kernel`."""
    _OPS[name] = kernel


def kernel_of(target):
    """The Kernel behind an FX node's target, or None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    return _OPS.get(_op_qualname(target))


def _op_qualname(target):
    return f"{target.namespace}::{target._opname}"


def source_digest(kernel):
    """sha256 over the kernel function's source and its module's (helpers
    it calls live there), or its marshalled code when no source is found,
    and the values its closure captured (a tile size from an enclosing
    function: same source, another kernel)."""
    h = hashlib.sha256()
    try:
        h.update(inspect.getsource(kernel.fn).encode())
    except (OSError, TypeError):
        h.update(marshal.dumps(kernel.fn.__code__))
    for cell in kernel.fn.__closure__ or ():
        try:
            h.update(repr(cell.cell_contents).encode())
        except ValueError:  # an empty cell
            h.update(b"<empty>")
    module = sys.modules.get(getattr(kernel.fn, "__module__", ""), None)
    try:
        h.update(inspect.getsource(module).encode() if module is not None else b"")
    except (OSError, TypeError):
        pass
    return h.hexdigest()


def _arguments(node):
    """The call's arguments in schema order: ("tensor", fx.Node) or
    ("value", the Python value)."""
    out = []
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            value = node.args[i]
        elif a.name in node.kwargs:
            value = node.kwargs[a.name]
        else:
            value = a.default_value if a.has_default_value() else None
        out.append(("tensor", value) if isinstance(value, torch.fx.Node) else ("value", value))
    return out


def _example(meta, generator):
    """A CPU tensor of `meta`'s shape and dtype: seeded normal floats, else zeros."""
    shape, dtype = tuple(int(d) for d in meta.shape), meta.dtype
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.zeros(shape, dtype=dtype)


def _price(key, kernel, arguments):
    """The kernel's Price for these arguments (one run, memoized)."""
    metas = [a.meta["val"] if kind == "tensor" else a for kind, a in arguments]
    signature = (key,) + tuple((tuple(m.shape), m.dtype) if isinstance(m, torch.Tensor)
                               else repr(m) for m in metas)
    with _lock:
        if signature in _PRICES:
            return _PRICES[signature]
    # Real tensors, though the backend is called under the tracer's fake mode.
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        generator = torch.Generator().manual_seed(0)
        args = [_example(m, generator) if kind == "tensor" else m
                for (kind, _), m in zip(arguments, metas)]
        with _run_lock:  # kernel.py's state is global: one run at a time
            price = Price(kernel.run(*args))  # CPU tensors: nothing charged
    with _lock:
        _PRICES[signature] = price
    return price


def _register(key, kernel, arguments):
    """Gives _C the callback that runs this call in a plan: the kernel on
    the plan's input tensors (CPU views of its memory) and the non-tensor
    arguments of the call."""
    with _lock:
        if _REGISTERED.get(key) is kernel:
            return
        _REGISTERED[key] = kernel  # another kernel object under a key: its callback replaces
    layout = [(kind, None if kind == "tensor" else value) for kind, value in arguments]

    def run(inputs):
        tensors = iter(inputs)
        args = [next(tensors) if kind == "tensor" else value for kind, value in layout]
        with _run_lock:  # plans may run on several threads
            out = kernel(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]
    _C._nki_register_graph_kernel(key, run)


def ir_call(node):
    """The IR of a kernel operator's node: (its tensor arguments as FX
    nodes, its attributes as IR text, a summary for metrics()). Prices the
    kernel for the node's shapes and registers its callback."""
    kernel = kernel_of(node.target)
    arguments = _arguments(node)
    values = [value for kind, value in arguments if kind == "value"]
    digest = hashlib.sha256((source_digest(kernel) + repr(values)).encode()).hexdigest()[:16]
    name = _op_qualname(node.target)
    key = f"{name}@{digest}"
    price = _price(key, kernel, arguments)
    _register(key, kernel, arguments)
    attrs = [f'kernel = "{key}"', f"time_us = {float(price.time_us)!r}",
             f"hbm_bytes = {int(price.hbm_bytes)}"]
    attrs += [f"busy_{e} = {float(price.busy_us[e])!r}" for e in _ENGINES if e in price.busy_us]
    summary = {"op": name, "kernel": kernel.name, "key": key, "time_us": price.time_us,
               "busy_us": dict(price.busy_us), "hbm_bytes": price.hbm_bytes}
    return [a for kind, a in arguments if kind == "tensor"], attrs, summary
