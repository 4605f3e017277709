"""Example 07: an accelerator-agnostic DDP script runs on "neuron" unchanged.

Written only against torch.accelerator and torch.distributed, as
pytorch/examples' distributed examples are: nothing here names Neuron. Under
neuronrun the accelerator is "neuron" (torchneuron registers itself when
torch is imported), the default backend for it is "neuron", and the model
trains on "neuron" tensors with DDP(device_ids=[local_rank]). The device's
events measure the modelled time of the simulated NeuronCore, so the step
time printed is what the step would take on Trainium2.

    neuronrun -n 4 examples/07_accelerator_ddp.py
    torchrun --nproc-per-node 4 examples/07_accelerator_ddp.py   # after `make install`

On a machine with CUDA the same file trains on the GPUs with NCCL.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, width), nn.GELU(), nn.LayerNorm(width),
                                  nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.body(x))


def batch(step, rank, size, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    y = x[:, :10].argmax(dim=1)  # learnable: which of the first 10 features is largest
    return x.to(device), y.to(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    acc = torch.accelerator.current_accelerator()
    torch.accelerator.set_device_index(local_rank)
    device = torch.device(acc.type, local_rank)
    dist.init_process_group(dist.get_default_backend_for_device(acc))
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = DDP(Net(args.width).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    for step in range(args.steps):
        x, y = batch(step, rank, args.batch, device)
        if step == args.steps - 1:
            start.record()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == args.steps - 1:
            end.record()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step} loss {mean.item():.4f}")
    torch.accelerator.synchronize()
    if rank == 0:
        print(f"accelerator {acc.type}, backend {dist.get_backend()}, "
              f"{dist.get_world_size()} ranks, parameters on {next(model.parameters()).device}")
        print(f"step time {start.elapsed_time(end):.3f} ms (device events)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
