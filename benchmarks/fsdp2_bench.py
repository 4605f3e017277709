#!/usr/bin/env python3
"""FSDP2 step-time benchmark: the same fully_shard training script on Gloo
(the CPU) and on "neuron", side by side in one run, with the ratio and the
target, and on "neuron" the modelled Trainium2 step, its exposed
communication and the device memory per rank.

    .venv/bin/python benchmarks/fsdp2_bench.py [--ranks 2,4,8] [--steps N] [--rounds R]
                                               [--width W]

For each rank count the driver launches `neuronrun -n R` on this script in
worker mode, once per backend, alternating --rounds times (the machine's two
vCPUs change speed for seconds at a time; every column is the median over
the rounds). The workers train an MLP of 6 Linear(W, W) layers (W = 256:
0.39M parameters), each layer and the root wrapped by fully_shard over a
1-D mesh of every rank, batch 1 per rank, SGD: per step FSDP2 all-gathers
each layer's parameters in forward and again in backward (reshard after
forward) and reduce-scatters its gradients, so the step is
communication-bound, as for DDP (ddp_bench.py). After --warmup steps each
rank times --steps steps; a step's time is the slowest rank's, the median
is reported. On "neuron" the worker also reports the modelled step (the
simulated compute clock's advance, the slowest rank's median), the device
model's compute within it (eager operations), the rest being communication
the step waited for (per step and rank, then the slowest rank's median),
and the device memory: peak allocated bytes per rank.

Target (issue #21): neuron's wall step time <= 0.5x Gloo's at 2, 4 and 8 ranks.
"""
import argparse
import datetime
import os
import statistics
import sys
import time

import bench_jobs

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, WIDTH = 6, 256
TARGET = 0.5


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    on_neuron = args.backend == "neuron"
    if on_neuron:
        import torchneuron  # noqa: F401  registers the device and the backend
        from torchneuron import fabric
    dist.init_process_group(args.backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (torch.device("neuron", torch.accelerator.current_device_index()) if on_neuron
              else torch.device("cpu"))
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = (torch.randn(1, args.width, generator=g).to(device) for _ in range(2))

    wall, modelled, compute = [], [], []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        if on_neuron:
            clock0, eager0 = fabric.clock()["compute_us"], fabric.eager_totals()["modelled_us"]
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step >= args.warmup:
            wall.append((time.perf_counter() - start) * 1e3)
            if on_neuron:
                modelled.append(fabric.clock()["compute_us"] - clock0)
                compute.append(fabric.eager_totals()["modelled_us"] - eager0)
    peak = torch.neuron.max_memory_allocated() if on_neuron else 0

    def slowest_median(values):
        t = torch.tensor(values or [0.0] * args.steps, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return statistics.median(t.tolist())

    exposed = [m - c for m, c in zip(modelled, compute)]  # per step, on this rank
    step_ms, modelled_us, compute_us, exposed_us = (
        slowest_median(v) for v in (wall, modelled, compute, exposed))
    peak_t = torch.tensor([peak], dtype=torch.float64)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"fsdp2_bench {args.backend} {world} {step_ms:.3f} {modelled_us:.1f} "
              f"{compute_us:.1f} {exposed_us:.1f} {peak_t.item() / 2**20:.2f}", flush=True)
    sys.stderr.flush()
    os._exit(0)  # no destructors: see ddp_bench.py


def measure(build, n, backend, args):
    rows = bench_jobs.worker_rows(build, n, __file__, "fsdp2_bench",
                                  ["--backend", backend, "--steps", str(args.steps),
                                   "--warmup", str(args.warmup), "--width", str(args.width)],
                                  python=args.python)
    rows = [r for r in rows if r[0] == backend and r[1] == str(n)]
    if not rows:
        sys.exit(f"fsdp2_bench: the {backend} job at {n} ranks printed no figures")
    return tuple(float(v) for v in rows[0][2:7])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating jobs per backend and rank count; medians are shown")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    params = LAYERS * (args.width * args.width + args.width)
    print(f"FSDP2 fully_shard per layer, MLP {LAYERS} x Linear({args.width}, {args.width}): "
          f"{params / 1e6:.2f}M parameters, batch 1 per rank, SGD; median of {args.steps} steps "
          f"after {args.warmup} warm-up, slowest rank per step; median of {args.rounds} "
          f"alternating jobs per column\n")
    print(f"{'ranks':>5} | {'gloo ms':>8} {'neuron ms':>9} | {'neuron/gloo':>11} {'target':>7} | "
          f"{'modelled us':>11} {'compute us':>10} {'exposed comm us':>15} {'peak MiB/rank':>13}")
    misses = []
    for n in [int(r) for r in args.ranks.split(",")]:
        gloo, neuron = [], []
        for _ in range(max(1, args.rounds)):
            gloo.append(measure(args.build, n, "gloo", args))
            neuron.append(measure(args.build, n, "neuron", args))
        t_gloo = statistics.median(r[0] for r in gloo)
        t_neuron, modelled, compute, exposed, peak = (statistics.median(c) for c in zip(*neuron))
        ratio = t_neuron / t_gloo
        if ratio > TARGET:
            misses.append(f"{n} ranks: {ratio:.2f}x")
        print(f"{n:>5} | {t_gloo:>8.1f} {t_neuron:>9.1f} | {ratio:>11.2f} {'<= 0.5x':>7} | "
              f"{modelled:>11.1f} {compute:>10.1f} {exposed:>15.1f} {peak:>13.2f}",
              flush=True)
    print("\nmodelled: the simulated compute clock's advance per step on \"neuron\" (Trainium2); "
          "compute: the device model's cost of the eager operations in it; exposed comm: the "
          "rest, collectives the step waited for; peak: torch.neuron.max_memory_allocated()")
    print("target: neuron step time <= 0.5x gloo's; " +
          ("all met" if not misses else "missed at " + ", ".join(misses)))


if __name__ == "__main__":
    main()
