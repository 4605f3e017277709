#!/usr/bin/env python3
"""Eager PyTorch on "cpu" against the same on "neuron": the wall time of one
small training step (forward, backward, AdamW) of the same model on this
CPU, side by side in one run, interleaved, with the ratio; and the step's
modelled time on the simulated NeuronCore (the device model, per op). A
third run on "neuron" with adaptive eager on (torch.neuron.adaptive_eager:
regions fused and priced as compiled plans) gives its modelled step and
its wall time against plain eager's; each neuron step ends with
torch.neuron.synchronize(), which prices adaptive eager's open region.

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


def step(model, opt, x, y, loss_fn=None):
    """One training step (cross entropy, or `loss_fn`); returns the loss."""
    import torch.nn.functional as F
    opt.zero_grad()
    loss = (loss_fn or F.cross_entropy)(model(x), y)
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

    runs = {d: make(torch, d.split("+")[0], args.hidden, args.batch) for d in DEVICES}
    wall = {d: [] for d in DEVICES}
    modelled = {d: [] for d in DEVICES if d != "cpu"}
    for i in range(10 + args.steps):  # 10 warm-up steps
        for d in DEVICES:
            before = fabric.clock()["compute_us"]
            with torch.neuron.adaptive_eager(d == "neuron+adaptive"):
                t0 = time.perf_counter()
                step(*runs[d])
                if d != "cpu":
                    torch.neuron.synchronize()
                elapsed = (time.perf_counter() - t0) * 1e6
            if i >= 10:
                wall[d].append(elapsed)
                if d != "cpu":
                    modelled[d].append(fabric.clock()["compute_us"] - before)
    stats = torch.neuron.adaptive_eager_stats()
    losses = {d: step(*runs[d]).item() for d in ("cpu", "neuron")}
    with torch.neuron.adaptive_eager():
        losses["neuron+adaptive"] = step(*runs["neuron+adaptive"]).item()
    report(args, wall, modelled, losses, stats, fabric.eager_totals()["operations"])


DEVICES = ("cpu", "neuron", "neuron+adaptive")


def report(args, wall, modelled, losses, stats, operations):
    med = {d: statistics.median(w) for d, w in wall.items()}
    mod = {d: statistics.median(m) for d, m in modelled.items()}
    steps = 10 + args.steps
    print(f"eager training step: MLP 64-{args.hidden}-{args.hidden}-10 with GELU and "
          f"LayerNorm, AdamW, batch {args.batch}, {args.steps} steps (medians)")
    print(f"  cpu     wall {med['cpu']:9.1f} us")
    print(f"  neuron  wall {med['neuron']:9.1f} us   modelled {mod['neuron']:8.1f} us "
          f"on the simulated NeuronCore ({operations} ops so far)")
    print(f"  ratio neuron / cpu wall: {med['neuron'] / med['cpu']:.2f}x (target <= 1.3x)")
    print(f"  neuron, adaptive eager: wall {med['neuron+adaptive']:9.1f} us "
          f"({med['neuron+adaptive'] / med['neuron']:.2f}x plain), modelled "
          f"{mod['neuron+adaptive']:8.1f} us ({mod['neuron+adaptive'] / mod['neuron']:.2f}x "
          f"plain); {stats['regions'] / steps:.1f} regions a step "
          f"({', '.join(f'{k} {v}' for k, v in sorted(stats['by_reason'].items()))}), "
          f"cache {stats['cache_hits']} hits / {stats['cache_misses']} misses, pricing "
          f"{stats['pricing_wall_us'] / steps:.0f} us wall a step")
    print(f"  losses equal: {len(set(losses.values())) == 1} ({losses['cpu']:.6f})")


if __name__ == "__main__":
    main()
