#!/usr/bin/env python3
"""What upstream FSDP2 and tensor-parallel scripts ask of the accelerator,
on 2 ranks, against one process on the CPU:

- random: init.uniform_ / normal_ and dropout on sharded DTensors through
  DTensor's RNG tracker (OffsetBasedRNGTracker, seed-and-offset state):
  the same seed gives the same values again, the shards differ, replicas
  agree, and a sharded init equals the one-device init of the same seed;
- meta: a model built on the meta device, fully_shard'ed, to_empty on the
  accelerator, reset_parameters(): its parameters equal the CPU module's
  init of the same seed (every shard's size is a multiple of 4, DTensor's
  offset alignment), and 4 training steps give the one-process CPU losses;
- sdpa: attention with F.scaled_dot_product_attention under tensor
  parallel (heads sharded): forward, backward, gradients and losses equal
  one process's on the CPU.

    neuronrun -n 2 tests/python/scripts/dtensor_device_parity.py

The default group is made by init_device_mesh (no backend named), and its
destruction must not warn "No backend of type 1 found". Rank 0 prints one
line per case and "dtensor device parity: 3 cases ok".
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import torchneuron  # noqa: F401  (registers the "neuron" device and backend)


def say(text):
    if dist.get_rank() == 0:
        print(text, flush=True)


def sharded_init(mesh, device, fill, seed, placements):
    torch.manual_seed(seed)
    x = distribute_tensor(torch.empty(8, 32, device=device), mesh, placements)
    fill(x)
    return x


def case_random(mesh, device):
    uniform = lambda t: nn.init.uniform_(t, -1, 1)  # noqa: E731
    normal = lambda t: nn.init.normal_(t, 0, 1)  # noqa: E731
    for name, fill in (("uniform_", uniform), ("normal_", normal)):
        a = sharded_init(mesh, device, fill, 7, [Shard(0)])
        b = sharded_init(mesh, device, fill, 7, [Shard(0)])
        assert torch.equal(a.to_local(), b.to_local()), f"{name}: same seed, other values"
        full = a.full_tensor().cpu()
        assert not torch.equal(full[:4], full[4:]), f"{name}: the two shards are equal"
        torch.manual_seed(7)
        one = fill(torch.empty(8, 32, device=device)).cpu()
        assert torch.equal(full, one), f"{name}: sharded init differs from one device's"
        r = sharded_init(mesh, device, fill, 7, [Replicate()])
        gathered = [torch.empty_like(r.to_local()) for _ in range(2)]
        dist.all_gather(gathered, r.to_local())
        assert torch.equal(gathered[0], gathered[1]), f"{name}: replicas differ"
    torch.manual_seed(3)
    ones = distribute_tensor(torch.ones(16, 64, device=device), mesh, [Shard(0)])
    first = F.dropout(ones, 0.25).full_tensor().cpu()
    torch.manual_seed(3)
    again = F.dropout(ones, 0.25).full_tensor().cpu()
    assert torch.equal(first, again), "dropout: same seed, other mask"
    assert not torch.equal(first[:8] == 0, first[8:] == 0), "dropout: shards share a mask"
    kept = (first != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.05, kept
    assert torch.equal(first[first != 0], torch.full_like(first[first != 0], 1 / 0.75))
    say("dtensor device parity random: uniform_, normal_, dropout on Shard(0) and Replicate "
        "reproducible, shards distinct, sharded init equals one device's")


class MLP(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16, device=device) for _ in range(3))
        self.out = nn.Linear(16, 8, device=device)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def train(model, x, y, steps=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def case_meta(mesh, device):
    torch.manual_seed(0)
    reference = MLP()  # the CPU module's own init
    with torch.device("meta"):
        model = MLP()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    torch.manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.reset_parameters()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.full_tensor().cpu(), q.detach()), f"{name}: init differs from CPU"
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
    rank = dist.get_rank()
    local = slice(4 * rank, 4 * rank + 4)  # data parallel: each rank half the batch
    # FSDP2 averages the gradients of the two halves: the CPU reference
    # trains on the whole batch (mse_loss is a mean, so the same gradient).
    got = train(model, x[local].to(device), y[local].to(device))
    want = train(reference, x, y)
    both = torch.tensor(got, device=device)
    dist.all_reduce(both)
    both = (both / 2).cpu().tolist()
    for a, b in zip(both, want):
        assert abs(a - b) <= 2e-6, (both, want)
    say(f"dtensor device parity meta: meta init + reset_parameters + FSDP2 equals the CPU "
        f"init; losses {' '.join(f'{v:.6f}' for v in both)}")


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.o = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda z: z.view(b, t, -1, 8).transpose(1, 2)  # noqa: E731  (head dim 8)
        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)),
                                           split(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


def case_sdpa(mesh, device):
    torch.manual_seed(0)
    reference = Attention()
    model = Attention()
    model.load_state_dict(reference.state_dict())
    model.to(device)
    parallelize_module(model, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(),
                                     "v": ColwiseParallel(), "o": RowwiseParallel()})
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 32, generator=g)
    got = train(model, x.to(device), torch.zeros(2, 6, 32, device=device), steps=3)
    want = train(reference, x, torch.zeros(2, 6, 32), steps=3)
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-5, (got, want)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        torch.testing.assert_close(full.cpu(), q.detach(), msg=name)
    say(f"dtensor device parity sdpa: tensor parallel attention, losses "
        f"{' '.join(f'{v:.6f}' for v in got)}")


def main():
    acc = torch.accelerator.current_accelerator()
    # As pytorch/examples' tensor-parallel scripts: the mesh makes the
    # default group, with no backend named.
    mesh = init_device_mesh(acc.type, (int(os.environ["WORLD_SIZE"]),))
    torch.accelerator.set_device_index(dist.get_rank())
    device = torch.device(acc.type, dist.get_rank())
    # A group without this rank: torch hands it a non-member marker, not a
    # group (torchneuron's default-backend fix must let it through).
    assert dist.new_group([0]) is not None
    case_random(mesh, device)
    case_meta(mesh, device)
    case_sdpa(mesh, device)
    say("dtensor device parity: 3 cases ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
