"""Gradient-norm clipping across every way a model is split.

The global gradient norm of a model trained with tensor, pipeline and
(sharded) data parallelism is the norm of the one-device model's gradient:
each element counted once. So, as Megatron-LM counts it:
  - a tensor-parallel split parameter (ColumnParallelLinear, RowParallelLinear
    weights, VocabParallelEmbedding) is counted on every tensor-parallel rank
    (each holds a different part); a replicated one (LayerNorm, a
    RowParallelLinear bias) only on tensor-parallel rank 0;
  - a FullyShardedDataParallel shard is counted on its data-parallel rank
    (the shards are disjoint: summed over the data-parallel group); a plain
    data-parallel replica once (its gradient is already averaged);
  - the sum is then taken over the tensor- and pipeline-parallel groups
    (torchneuron.parallel's, when initialized).

    loss.backward()     # or engine.step(...)
    norm = torchneuron.parallel.clip_grad_norm_(parts, max_norm=1.0)
    opt.step()
"""
import torch
import torch.distributed as dist

from . import mesh


def counted(param, tp_rank):
    """Whether `param`'s gradient counts on tensor-parallel rank `tp_rank`:
    a split parameter everywhere, a replicated one on rank 0 only."""
    return tp_rank == 0 or getattr(param, "tensor_parallel_dim", None) is not None


def _params(part):
    return part.parameters() if isinstance(part, torch.nn.Module) else [part]


def _local_squares(parts, tp_rank):
    """(sum over FSDP shards per data-parallel group, sum over plain gradients).
    A part that shards its gradients (FullyShardedDataParallel) says so by
    providing _local_grad_squares(tp_rank) and its process_group."""
    sharded, plain = {}, torch.zeros((), dtype=torch.float64)
    for part in parts:
        if hasattr(part, "_local_grad_squares"):
            group = part.process_group
            sharded[group] = sharded.get(group, 0.0) + part._local_grad_squares(tp_rank)
        else:
            for p in _params(part):
                if p.grad is not None and counted(p, tp_rank):
                    plain += p.grad.detach().double().pow(2).sum()  # no sync per parameter
    return sharded, plain


def clip_grad_norm_(parts, max_norm):
    """Scales the gradients of `parts` (modules, FullyShardedDataParallel
    wrappers or parameters: this rank's share of the model) so that the
    model's global gradient 2-norm is at most `max_norm`; returns that norm
    before clipping (float32 tensor). Collective over the data-parallel group
    of each sharded part and over the tensor- and pipeline-parallel groups:
    every rank calls it."""
    if isinstance(parts, (torch.nn.Module, torch.Tensor)):
        parts = [parts]
    parts = list(parts)
    tp_rank = mesh.get_tensor_parallel_rank() if mesh.is_initialized() else 0
    sharded, plain = _local_squares(parts, tp_rank)
    total = plain.reshape(1)
    for group, value in sharded.items():
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, group=group)
        total += t
    if mesh.is_initialized():
        for group in (mesh.get_tensor_parallel_group(), mesh.get_pipeline_parallel_group()):
            if dist.get_world_size(group) > 1:
                dist.all_reduce(total, group=group)
    norm = total.sqrt()
    coef = max_norm / (norm.item() + 1e-6)
    if coef < 1:
        grads = [p.grad.detach() for part in parts for p in _params(part) if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef)  # one call for all of them
    return norm.to(torch.float32)[0]
