"""The selective scan kernels as torch operators on "neuron", differentiable:

    y = torchneuron.nki.selective_scan_op.selective_scan(x, delta, A, B, C)

torch.ops.nki.selective_scan(x, delta, A, B, C) -> y runs the kernel
selective_scan.selective_scan (the scan of torchneuron.models.ssm, shapes
there); its gradient is torch.ops.nki.selective_scan_backward(x, delta, A,
B, C, dy) -> (dx, ddelta, dA, dB, dC), the kernel
selective_scan_backward.selective_scan_backward. Both charge their
kernels' modelled time to the compute clock on "neuron".
"""

import torch

from .op import as_op
from .selective_scan import selective_scan as _forward
from .selective_scan_backward import selective_scan_backward as _backward_kernel

forward_op = as_op(_forward, "nki::selective_scan",
                   schema="(Tensor x, Tensor delta, Tensor A, Tensor B, Tensor C) -> Tensor",
                   fake=lambda x, delta, A, B, C: torch.empty_like(x))
backward_op = as_op(_backward_kernel, "nki::selective_scan_backward", outputs=5,
                    schema="(Tensor x, Tensor delta, Tensor A, Tensor B, Tensor C, "
                           "Tensor dy) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
                    fake=lambda x, delta, A, B, C, dy: tuple(
                        torch.empty_like(t) for t in (x, delta, A, B, C)))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    return backward_op(*ctx.saved_tensors, dy.contiguous())


forward_op.register_autograd(_backward, setup_context=_setup_context)


def selective_scan(x, delta, A, B, C):
    """y [batch, T, inner] of torchneuron.models.ssm.selective_scan by the
    kernel (x, delta [batch, T, inner], A [inner], B, C [batch, T, state]),
    differentiable through the backward kernel."""
    return forward_op(x, delta, A, B, C)
