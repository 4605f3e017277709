"""Flash attention as torch operators on "neuron", differentiable:

    out = torchneuron.nki.attention_op.attention(q, k, v, causal=True)

torch.ops.nki.flash_attention_forward(q, k, v, causal) -> (out, lse) runs
the kernel flash_attention_lse; its gradient is
torch.ops.nki.flash_attention_backward(q, k, v, out, dout, lse, causal) ->
(dq, dk, dv), the kernel flash_attention_backward. Both charge their
kernels' modelled time to the compute clock on "neuron".
"""

import torch

from .attention import flash_attention_lse
from .attention_backward import flash_attention_backward
from .op import as_op

forward_op = as_op(flash_attention_lse, "nki::flash_attention_forward", outputs=2,
                   schema="(Tensor q, Tensor k, Tensor v, bool causal=False) -> "
                          "(Tensor, Tensor)",
                   fake=lambda q, k, v, causal=False: (
                       torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)))
backward_op = as_op(flash_attention_backward, "nki::flash_attention_backward", outputs=3,
                    schema="(Tensor q, Tensor k, Tensor v, Tensor out, Tensor dout, "
                           "Tensor lse, bool causal=False) -> (Tensor, Tensor, Tensor)",
                    fake=lambda q, k, v, out, dout, lse, causal=False: (
                        torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))


def _setup_context(ctx, inputs, output):
    q, k, v, causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal


def _backward(ctx, dout, dlse):
    """dlse is not propagated: the logsumexp is an internal output."""
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = backward_op(q, k, v, out, dout.contiguous(), lse, ctx.causal)
    return dq, dk, dv, None


forward_op.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, causal=False):
    """softmax(q @ k.T / sqrt(D)) @ v by the flash attention kernels
    (q, k, v [B, H, S, D], D <= 128), differentiable."""
    return forward_op(q, k, v, causal)[0]
