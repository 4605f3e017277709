"""Kernels as torch operators (torch.library.custom_op).

    add_op = nki.as_op(add_kernel, "mylib::add", schema="(Tensor a, Tensor b) -> Tensor")
    y = add_op(x1.to("neuron"), x2.to("neuron"))   # runs the kernel, charges its time

The operator runs the kernel on "neuron" and on the CPU tensors alike (the
kernel's outputs on its inputs' device), and takes its fake (meta)
implementation from the kernel's reference, so shapes propagate under
torch.compile's tracing. Autograd: `backward(ctx, *grads)` and
`setup_context(ctx, inputs, output)` as torch.library.register_autograd
takes them; the backward is usually another kernel's operator.

In a torch.compile(backend="neuron") graph the operator is one node of the
compiled plan, priced by the kernel's own schedule for the traced shapes
and run by calling the kernel (graph_kernel.py, docs/nki.md).
"""

import inspect

import torch

from . import graph_kernel
from .kernel import Kernel


def default_schema(kernel, outputs=1):
    """Every parameter of the kernel a Tensor (bools and floats when their
    default is one), returning `outputs` Tensors."""
    params = []
    for p in inspect.signature(kernel.fn).parameters.values():
        kind = {bool: "bool", float: "float", int: "int"}.get(type(p.default), "Tensor")
        default = "" if p.default is inspect.Parameter.empty else f"={p.default}"
        params.append(f"{kind} {p.name}{default}")
    ret = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"
    return f"({', '.join(params)}) -> {ret}"


def as_op(kernel, name, schema=None, outputs=1, backward=None, setup_context=None,
          fake=None):
    """Registers `kernel` as the torch operator `name` ("namespace::op");
    returns it (callable; torch.ops.namespace.op is the same operator).
    `fake` (the outputs' shapes from fake inputs) replaces the reference
    as the fake implementation when the reference cannot run on fake
    tensors."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"nki.as_op: {kernel!r} is not a kernel (use @nki.jit)")
    schema = schema or default_schema(kernel, outputs)

    def run(*args):
        return kernel(*args)

    op = torch.library.custom_op(name, run, mutates_args=(), schema=schema)
    graph_kernel.register_op(name, kernel)
    if fake is not None:
        op.register_fake(fake)
    elif kernel.reference is not None:
        def fake(*args):
            out = kernel.reference(*args)
            return out.clone() if isinstance(out, torch.Tensor) else tuple(o.clone() for o in out)
        op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
