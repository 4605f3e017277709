"""The selective scan kernel as a torch operator on "neuron":

    y = torchneuron.nki.selective_scan_op.selective_scan(x, delta, A, B, C)

torch.ops.nki.selective_scan(x, delta, A, B, C) -> y runs the kernel
selective_scan.selective_scan (the scan of torchneuron.models.ssm, shapes
there) and charges its modelled time to the compute clock on "neuron".
"""

import torch

from .op import as_op
from .selective_scan import selective_scan as _kernel

forward_op = as_op(_kernel, "nki::selective_scan",
                   schema="(Tensor x, Tensor delta, Tensor A, Tensor B, Tensor C) -> Tensor",
                   fake=lambda x, delta, A, B, C: torch.empty_like(x))


def selective_scan(x, delta, A, B, C):
    """y [batch, T, inner] of torchneuron.models.ssm.selective_scan by the
    kernel (x, delta [batch, T, inner], A [inner], B, C [batch, T, state])."""
    return forward_op(x, delta, A, B, C)
