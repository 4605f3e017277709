"""The collectives of expert-parallel dispatch, on
torch.distributed.all_to_all_single (any backend: "neuron", Gloo, ...).

    recv_counts = exchange_counts(send_counts, group)            # (ep * E_local,)
    y = all_to_all(x, output_splits, input_splits, group)       # autograd

exchange_counts sends each peer how many rows this rank sends to each of
its experts, equal splits of E_local counts (torchtitan's and Megatron-LM's
first exchange). all_to_all moves rows with uneven split sizes (zero
included); its backward is the reverse exchange of the gradient. Both are
kept out of torch.compile's graphs (a compiled caller breaks its graph and
runs them eagerly): the split sizes are data.
"""
import torch
import torch.distributed as dist
from torch._compile import _disable_dynamo


@_disable_dynamo
def exchange_counts(send_counts, group):
    """send_counts: (ep * E_local,) int64, this rank's rows for every
    expert, experts of ep rank r at [r * E_local, (r + 1) * E_local).
    Returns (ep * E_local,): the rows each ep rank sends to each of this
    rank's experts, source-major ([src * E_local + local expert])."""
    recv = torch.empty_like(send_counts)
    dist.all_to_all_single(recv, send_counts, group=group)
    return recv


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=output_splits,
                               input_split_sizes=input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        back = grad.new_empty((sum(input_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), output_split_sizes=input_splits,
                               input_split_sizes=output_splits, group=ctx.group)
        return back, None, None, None


@_disable_dynamo
def all_to_all(x, output_splits, input_splits, group):
    """Rows of `x` (input_splits[r] of them to ep rank r, in rank order) to
    their ranks; returns the rows received (output_splits[r] from rank r).
    Differentiable: the gradient goes back the same way."""
    return _AllToAll.apply(x, list(output_splits), list(input_splits), group)
