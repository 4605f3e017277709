#!/usr/bin/env python3
"""MoE step-time benchmark: examples/09_moe_gpt.py on Gloo (the CPU) and on
"neuron", side by side, with the ratio and the target, and on "neuron" the
modelled Trainium2 step and the all-to-all's share of it.

    .venv/bin/python benchmarks/moe_bench.py [--ranks 2,4,8] [--steps N] [--rounds R]
                                             [-- EXAMPLE ARGS]

For each rank count the driver runs `neuronrun -n R examples/09_moe_gpt.py
--backend gloo|neuron --steps N` (ep = min(R, 4): ep 2 at 2 ranks, ep 4 x
dp 1 at 4, ep 4 x dp 2 at 8; arguments after `--` go to every job),
alternating the backends --rounds times (the machine's vCPUs change speed
for seconds at a time; every column is the median over the rounds). Each
job reports the median over its steps after the first of the slowest
rank's wall step, and on "neuron" the modelled step and that rank's
all-to-all time (the example's "median step after the first" line).

Target (issue 47): neuron's wall step time <= 0.5x Gloo's.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "09_moe_gpt.py")
TARGET = 0.5
MEDIAN = re.compile(r"\[rank 0\]: median step after the first: wall ([\d.]+) ms"
                    r"(?:, modelled ([\d.]+) us, all-to-all ([\d.]+) us)?")


def measure(build, n, backend, args):
    """(wall ms, modelled us, all-to-all us) of one job (0 off "neuron")."""
    cmd = [os.path.join(build, "launcher", "neuronrun"), "-n", str(n), EXAMPLE,
           "--backend", backend, "--ep", str(min(n, 4)), "--steps", str(args.steps),
           *args.example]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = MEDIAN.search(proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return tuple(float(v or 0) for v in found.groups())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts")
    p.add_argument("--steps", type=int, default=10, help="steps per job (the first is not timed)")
    p.add_argument("--rounds", type=int, default=3,
                   help="alternating jobs per backend and rank count; medians are shown")
    p.add_argument("example", nargs="*", help="after --: arguments for every job")
    args = p.parse_args()
    print(f"examples/09_moe_gpt.py {' '.join(args.example) or '(defaults)'}; median of "
          f"{args.steps - 1} steps after the first, slowest rank per step; median of "
          f"{args.rounds} alternating jobs per column\n")
    print(f"{'ranks':>5} {'layout':>10} | {'gloo ms':>8} {'neuron ms':>9} | {'neuron/gloo':>11} "
          f"{'target':>7} | {'modelled us':>11} {'all-to-all us':>13} {'share':>6}")
    misses = []
    for n in [int(r) for r in args.ranks.split(",")]:
        gloo, neuron = [], []
        for _ in range(max(1, args.rounds)):
            gloo.append(measure(args.build, n, "gloo", args))
            neuron.append(measure(args.build, n, "neuron", args))
        t_gloo = statistics.median(r[0] for r in gloo)
        t_neuron, modelled, a2a = (statistics.median(c) for c in zip(*neuron))
        ratio = t_neuron / t_gloo
        if ratio > TARGET:
            misses.append(f"{n} ranks: {ratio:.2f}x")
        layout = f"ep{min(n, 4)}xdp{max(1, n // 4)}"
        print(f"{n:>5} {layout:>10} | {t_gloo:>8.1f} {t_neuron:>9.1f} | {ratio:>11.2f} "
              f"{'<= 0.5x':>7} | {modelled:>11.1f} {a2a:>13.1f} {100 * a2a / modelled:>5.1f}%",
              flush=True)
    print("\nmodelled: the slowest rank's simulated compute clock's advance per step on "
          "\"neuron\" (Trainium2); all-to-all: that rank's all_to_all_single calls on the ep "
          "group on the fabric model")
    print("target: neuron step time <= 0.5x gloo's; " +
          ("all met" if not misses else "missed at " + ", ".join(misses)))


if __name__ == "__main__":
    main()
