#!/usr/bin/env python3
"""torchneuron.parallel.initialize on a real job: every group's members, the
sampler over the data-parallel group, and DDP over it.

    neuronrun -n 8 tests/python/scripts/parallel_layout.py --tp 2 --pp 2

Checks, on every rank: the tensor/data/pipeline groups hold the ranks the
layout formula says (an all-gather of job ranks inside each group); each
data-parallel rank's DistributedSampler indices equal
torch.utils.data.DistributedSampler's for (dp size, dp rank); after one step
of torchneuron.parallel.DistributedDataParallel over the data-parallel group
the replicas of a data-parallel group are equal and the gradient equals the
mean of the group's local gradients; a GPT whose heads or hidden size tp
does not divide is refused naming the sizes. Rank 0 prints one summary line.
"""
import argparse
import datetime

import torch
import torch.distributed as dist
import torch.utils.data

import torchneuron  # noqa: F401  registers "neuron"
import torchneuron.parallel as parallel


def gather_members(group):
    size = dist.get_world_size(group)
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(out, torch.tensor([dist.get_rank()]), group=group)
    return [int(t.item()) for t in out]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = parallel.initialize(tp=args.tp, pp=args.pp)
    tp, dp, pp = layout.tp, layout.dp, layout.pp
    assert tp * dp * pp == world
    want_coords = (rank % tp, rank // tp % dp, rank // (tp * dp))
    got_coords = (parallel.get_tensor_parallel_rank(), parallel.get_data_parallel_rank(),
                  parallel.get_pipeline_parallel_rank())
    assert got_coords == want_coords, f"rank {rank}: coordinates {got_coords} != {want_coords}"
    expected = {
        "tensor": [rank // tp * tp + i for i in range(tp)],
        "data": [want_coords[2] * tp * dp + d * tp + want_coords[0] for d in range(dp)],
        "pipeline": [s * tp * dp + want_coords[1] * tp + want_coords[0] for s in range(pp)],
    }
    groups = {"tensor": parallel.get_tensor_parallel_group(),
              "data": parallel.get_data_parallel_group(),
              "pipeline": parallel.get_pipeline_parallel_group()}
    for axis, group in groups.items():
        members = gather_members(group)
        assert members == expected[axis], f"rank {rank}: {axis} group {members} != {expected[axis]}"
        assert layout.group_ranks(axis) == expected[axis]

    dataset = list(range(101))
    ours = parallel.DistributedSampler(dataset, seed=3)
    ours.set_epoch(2)
    theirs = torch.utils.data.DistributedSampler(dataset, num_replicas=dp,
                                                 rank=want_coords[1], seed=3)
    theirs.set_epoch(2)
    assert list(ours) == list(theirs), f"rank {rank}: sampler differs from torch's"

    torch.manual_seed(rank)  # replicas differ until DDP broadcasts the group's rank 0
    model = torch.nn.Linear(8, 4)
    ddp = parallel.DistributedDataParallel(model)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(100 + rank))
    ddp(x).square().sum().backward()
    local = torch.autograd.grad(model(x).square().sum(), model.weight)[0]
    grads = [torch.zeros_like(local) for _ in range(dp)]
    dist.all_gather(grads, local, group=groups["data"])
    mean = grads[0]
    for g in grads[1:]:
        mean = mean + g
    mean = mean / dp
    assert torch.equal(model.weight.grad, mean), f"rank {rank}: DDP gradient is not the mean"
    weights = [torch.zeros_like(model.weight) for _ in range(dp)]
    dist.all_gather(weights, model.weight.detach(), group=groups["data"])
    assert all(torch.equal(w, weights[0]) for w in weights), f"rank {rank}: replicas differ"
    # A model the tensor-parallel size does not fit is refused, naming the
    # sizes: heads, and a hidden size layer by layer.
    from torchneuron.models.gpt import GPT, GPTConfig
    refused = [
        (lambda: GPT(GPTConfig(heads=3, dim=48)),
         f"tensor-parallel size {tp} does not divide the 3 attention heads"),
        (lambda: GPT(GPTConfig(heads=4, dim=30)), "4 heads do not divide the hidden size 30"),
        (lambda: parallel.ColumnParallelLinear(8, 2 * tp + 1),
         f"ColumnParallelLinear: out_features ({2 * tp + 1}) is not divisible by the "
         f"tensor-parallel size {tp}"),
        (lambda: parallel.RowParallelLinear(2 * tp + 1, 8),
         f"RowParallelLinear: in_features ({2 * tp + 1}) is not divisible by the "
         f"tensor-parallel size {tp}"),
    ]
    for make, message in refused:
        try:
            make()
            raise AssertionError(f"rank {rank}: accepted, expected: {message}")
        except ValueError as e:
            assert message in str(e), e
    dist.barrier()
    if rank == 0:
        print(f"parallel layout tp={tp} dp={dp} pp={pp}: groups, sampler and DDP ok "
              f"on {world} ranks", flush=True)


if __name__ == "__main__":
    main()
