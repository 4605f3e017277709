"""Process groups on the "neuron" device, one mode per run (test_device.py):

  split     init_process_group(device_id=neuron:LOCAL_RANK), then
            split_group([[0, 1], [2, 3], ...]): an allreduce on neuron
            tensors within each half
  mixed     init_process_group("cpu:gloo,neuron:neuron"): CPU tensors go to
            Gloo, neuron tensors to the neuron backend

Every rank prints "ok <mode>" when its checks pass.
"""
import os
import sys

import torch
import torch.distributed as dist


def split():
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("neuron", local)
    assert dist.get_default_backend_for_device("neuron") == "neuron"
    dist.init_process_group("neuron", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    halves = [list(range(0, world // 2)), list(range(world // 2, world))]
    group = dist.split_group(split_ranks=halves)
    mine = halves[0] if rank in halves[0] else halves[1]
    assert dist.get_world_size(group) == len(mine), dist.get_world_size(group)
    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t, group=group)
    expected = float(sum(r + 1 for r in mine))
    assert t.device == device and torch.equal(t.cpu(), torch.full((4,), expected)), t
    dist.barrier()


def mixed():
    local = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("cpu:gloo,neuron:neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    assert type(pg._get_backend(torch.device("cpu"))).__name__ == "ProcessGroupGloo"
    assert type(pg._get_backend(torch.device("neuron"))).__name__ == "BackendNeuron"
    c = torch.ones(3) * rank
    n = torch.ones(3, device=torch.device("neuron", local)) * rank
    dist.all_reduce(c)
    dist.all_reduce(n)
    total = float(sum(range(world)))
    assert torch.equal(c, torch.full((3,), total)) and torch.equal(n.cpu(), c)


if __name__ == "__main__":
    mode = sys.argv[1]
    {"split": split, "mixed": mixed}[mode]()
    print(f"ok {mode}", flush=True)
    dist.destroy_process_group()
