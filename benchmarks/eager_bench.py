#!/usr/bin/env python3
"""Eager PyTorch on "cpu" against the same on "neuron": the wall time of one
small training step (forward, backward, AdamW) of the same model on this
CPU, side by side in one run, interleaved, with the ratio; and the step's
modelled time on the simulated NeuronCore (the device model, per op).

    .venv/bin/python benchmarks/eager_bench.py [--build build] [--steps 200]
                                               [--batch 32] [--hidden 256]

Target (issue #19): neuron's wall time <= 1.3x the CPU's (docs/performance.md).
"""
import argparse
import os
import statistics
import sys
import time


def make(torch, device, hidden=256, batch=32):
    """The benchmark's model (MLP 64-hidden-hidden-10, GELU, LayerNorm) on
    `device`, its AdamW and a batch: (model, optimizer, x, y), the same
    numbers on every device."""
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.LayerNorm(hidden),
                          nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 64, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    return model, opt, x, y


def step(model, opt, x, y):
    """One training step; returns the loss."""
    import torch.nn.functional as F
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from torchneuron import fabric
    torch.set_num_threads(1)

    runs = {d: make(torch, d, args.hidden, args.batch) for d in ("cpu", "neuron")}
    wall = {"cpu": [], "neuron": []}
    for _ in range(10):  # warm-up
        for d in runs:
            step(*runs[d])
    modelled = []
    for _ in range(args.steps):
        for d in ("cpu", "neuron"):
            before = fabric.clock()["compute_us"]
            t0 = time.perf_counter()
            step(*runs[d])
            wall[d].append((time.perf_counter() - t0) * 1e6)
            if d == "neuron":
                modelled.append(fabric.clock()["compute_us"] - before)
    loss_cpu = step(*runs["cpu"]).item()
    loss_neuron = step(*runs["neuron"]).item()
    cpu_us, neuron_us = statistics.median(wall["cpu"]), statistics.median(wall["neuron"])
    print(f"eager training step: MLP 64-{args.hidden}-{args.hidden}-10 with GELU and "
          f"LayerNorm, AdamW, batch {args.batch}, {args.steps} steps (medians)")
    print(f"  cpu     wall {cpu_us:9.1f} us")
    print(f"  neuron  wall {neuron_us:9.1f} us   modelled {statistics.median(modelled):8.1f} us "
          f"on the simulated NeuronCore ({fabric.eager_totals()['operations']} ops so far)")
    print(f"  ratio neuron / cpu wall: {neuron_us / cpu_us:.2f}x (target <= 1.3x)")
    print(f"  losses equal: {loss_cpu == loss_neuron} ({loss_cpu:.6f})")


if __name__ == "__main__":
    main()
