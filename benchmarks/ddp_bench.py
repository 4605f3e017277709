#!/usr/bin/env python3
"""DDP step-time benchmark: unchanged DistributedDataParallel on Gloo against
the neuron backend, side by side in one run, with the ratio and the target.

    .venv/bin/python benchmarks/ddp_bench.py [--ranks 2,4,8] [--steps N] [--batch B]
                                             [--backends gloo,neuron] [--bucket-view]
                                             [--shared-tensors] [--rounds R] [--width W]

For each rank count the driver launches `neuronrun -n R` on this script in
worker mode, once per backend. The workers train the same model with SGD: an
MLP of 6 Linear(W, W) layers (W = 256 by default: 0.39M parameters, 1.5 MiB of
fp32 gradients allreduced per step; 512: 6 MiB; 1024: 24 MiB). After --warmup
steps each rank times --steps steps; a step's time is the slowest rank's; the
worker reports the median (rank 0 prints "ddp_bench <backend> <ranks> <step
ms> <compute ms> <no-comm ms>"), the same for steps under no_sync() (no
gradient allreduce: compute only), and for a second DDP model whose
communication hook returns the bucket untouched (everything DDP does, its
bucket copies included, but the allreduce: the floor any backend could
reach).

Target: neuron's step time <= 0.5x Gloo's. That needs a communication-bound
step: no-comm / Gloo step (the "floor" column) must be well below 0.5, or the
ratio measures DDP's own work and the machine rather than the backend. With
this machine's torch (generic BLAS, 2 cores) a batch of 8 per rank costs ~80
ms of compute per step against ~50 ms of Gloo allreduce at 2 ranks (floor
0.63-0.75), so the batch is 1 per rank; and the width is 256, where the floor
is 0.10-0.28 at 2-8 ranks. At W = 512 it is 0.3-0.44, and at W = 1024 0.36-0.55
moving with the machine's spells (DDP's copies of 24 MiB of gradients into and
out of its buckets alone cost 3-8 ms per step): there no backend can meet the
target reliably.
The two backends' jobs alternate --rounds times per rank count and every
column is the median over the rounds: this machine's two vCPUs move between
faster and slower states for seconds at a time, and one job each would let
one backend have the slow seconds.
--backends names the two columns (gloo,gloo tries the driver without neuron);
a column BACKEND/torchneuron trains with torchneuron.parallel's own
DistributedDataParallel instead of torch's (e.g. gloo,neuron/torchneuron).
"""
import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time

import bench_jobs

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, WIDTH, BATCH = 6, 256, 1
TARGET = 0.5


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.backend == "neuron" or args.ddp == "torchneuron":
        import torchneuron  # noqa: F401  registers the "neuron" backend
    if args.backend == "neuron" and args.shared_tensors:
        os.environ["NEURON_SHARED_TENSORS"] = "1"  # read when the process group is made
    if args.ddp == "torchneuron":
        import torchneuron.parallel
        DDP = torchneuron.parallel.DistributedDataParallel  # noqa: N806
    dist.init_process_group(args.backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    def mlp():
        torch.manual_seed(0)
        layers = []
        for _ in range(LAYERS):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers)

    model = DDP(mlp(), gradient_as_bucket_view=args.bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = (torch.randn(args.batch, args.width, generator=g) for _ in range(2))

    def median_step_ms(sync):
        times = []
        for step in range(args.warmup + args.steps):
            dist.barrier()
            start = time.perf_counter()
            with contextlib.nullcontext() if sync else model.no_sync():
                opt.zero_grad(set_to_none=False)
                torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return statistics.median(slowest.tolist()) * 1e3

    step_ms = median_step_ms(sync=True)
    compute_ms = median_step_ms(sync=False)  # the same step without gradient allreduce
    # The floor: DDP as it is, with an allreduce that costs nothing.
    no_comm_ms = 0.0
    if args.ddp == "torch":
        def untouched(state, bucket):
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        model = DDP(mlp(), gradient_as_bucket_view=args.bucket_view)
        model.register_comm_hook(None, untouched)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        no_comm_ms = median_step_ms(sync=True)
    if rank == 0:
        print(f"ddp_bench {args.backend}/{args.ddp} {world} {step_ms:.3f} {compute_ms:.3f} "
              f"{no_comm_ms:.3f}", flush=True)
    # Destroying a Gloo process group at exit joins its worker threads while holding the
    # GIL, and a worker just freeing a finished Work's tensor needs the GIL: a deadlock
    # (seen on torch 1.13). End without destructors: the measurement is printed.
    sys.stderr.flush()
    os._exit(0)


def measure(build, python, n, column, args):
    """(step ms, compute ms, no-comm ms) of one backend/DDP column at n ranks."""
    backend, _, ddp = column.partition("/")
    ddp = ddp or "torch"
    rows = bench_jobs.worker_rows(
        build, n, __file__, "ddp_bench",
        ["--backend", backend, "--ddp", ddp, "--steps", str(args.steps),
         "--warmup", str(args.warmup), "--batch", str(args.batch), "--width", str(args.width)] +
        (["--bucket-view"] if args.bucket_view else []) +
        (["--shared-tensors"] if args.shared_tensors else []), python=python)
    rows = [r for r in rows if r[0] == f"{backend}/{ddp}" and r[1] == str(n)]
    if not rows:
        sys.exit(f"ddp_bench: the {column} job at {n} ranks printed no figures")
    return tuple(float(v) for v in rows[0][2:5])


def medians(runs):
    """Column-wise medians of (step ms, compute ms, no-comm ms) rows."""
    return tuple(statistics.median(column) for column in zip(*runs))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts")
    p.add_argument("--backends", default="gloo,neuron", help="baseline,candidate")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=BATCH, help="samples per rank")
    p.add_argument("--width", type=int, default=WIDTH,
                   help="the MLP's layer width (6 square Linear layers)")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP(gradient_as_bucket_view=True) on both backends: gradients live "
                        "in the allreduce buckets, saving DDP two copies of them per step")
    p.add_argument("--shared-tensors", action="store_true",
                   help="NEURON_SHARED_TENSORS=1 for the neuron backend: gradients and buckets "
                        "in registered memory, so its allreduce works in place (no staging)")
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating jobs per backend and rank count; medians are shown")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--ddp", default="torch", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    base, cand = args.backends.split(",")
    params = LAYERS * (args.width * args.width + args.width)
    print(f"DDP, MLP {LAYERS} x Linear({args.width}, {args.width}): {params / 1e6:.2f}M parameters "
          f"({params * 4 / 2**20:.1f} MiB fp32 grads), batch {args.batch} per rank, SGD, "
          f"gradient_as_bucket_view={args.bucket_view}, "
          f"NEURON_SHARED_TENSORS={int(args.shared_tensors)}; "
          f"median of {args.steps} steps after {args.warmup} warm-up, slowest rank per step; "
          f"median of {args.rounds} alternating jobs per column\n")
    print(f"{'ranks':>5} | {'compute ms':>10} {'no-comm ms':>10} | {base + ' ms':>9} "
          f"{cand + ' ms':>9} | {cand + '/' + base:>11} {'floor':>5} {'target':>7}")
    misses = []
    for n in [int(r) for r in args.ranks.split(",")]:
        base_runs, cand_runs = [], []
        for _ in range(max(1, args.rounds)):  # alternating
            base_runs.append(measure(args.build, args.python, n, base, args))
            cand_runs.append(measure(args.build, args.python, n, cand, args))
        t_base, compute_base, free_base = medians(base_runs)
        t_cand, compute_cand, free_cand = medians(cand_runs)
        compute = min(compute_base, compute_cand)
        free = min(x for x in (free_base, free_cand, t_base, t_cand) if x > 0)
        ratio = t_cand / t_base
        if ratio > TARGET:
            misses.append(f"{n} ranks: {ratio:.2f}x")
        print(f"{n:>5} | {compute:>10.1f} {free:>10.1f} | {t_base:>9.1f} {t_cand:>9.1f} | "
              f"{ratio:>11.2f} {free / t_base:>5.2f} {'<= ' + str(TARGET) + 'x':>7}", flush=True)
    print(f"\ncompute: the same step under no_sync() (no gradient allreduce), ms; no-comm: a DDP "
          f"step whose allreduce is a no-op hook (DDP's own bucket copies, no communication); "
          f"floor: no-comm / {base}, the best ratio any backend could reach")
    print(f"target: {cand} step time <= {TARGET}x {base}'s; " +
          ("all met" if not misses else "missed at " + ", ".join(misses)))


if __name__ == "__main__":
    main()
