#!/usr/bin/env python3
"""torch.profiler's cost on "neuron": the wall time of eager_bench's training
step on "cpu" and on "neuron", unprofiled and under torch.profiler
(cpu: activities [CPU]; neuron: [CPU] and [CPU, PrivateUse1], the latter
giving each op's device time), the five interleaved round by round in one
process, medians.

    .venv/bin/python benchmarks/profiler_bench.py [--build build] [--rounds 24]
                                                  [--steps 10]

Target (issue #46): with profiling on, neuron / cpu <= 1.5x (docs/performance.md).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_bench  # noqa: E402  (its model and step)


def model_and_step(torch, device):
    """eager_bench's model and batch on `device` and one training step of it."""
    model, opt, x, y = eager_bench.make(torch, device)
    return lambda: eager_bench.step(model, opt, x, y)


def measure(configs, steps_by_device, rounds, steps):
    """Each round runs every configuration for `steps` steps (under its own
    profile when it has activities); returns the median step per config."""
    from torch.profiler import profile
    wall = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (device, activities) in configs.items():
            prof = profile(activities=activities) if activities else None
            if prof:
                prof.__enter__()
            for _ in range(steps):
                t0 = time.perf_counter()
                steps_by_device[device]()
                wall[name].append((time.perf_counter() - t0) * 1e6)
            if prof:
                prof.__exit__(None, None, None)
    return {name: statistics.median(w) for name, w in wall.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from torch.profiler import ProfilerActivity
    torch.set_num_threads(1)
    cpu, pu1 = ProfilerActivity.CPU, ProfilerActivity.PrivateUse1
    configs = {"cpu": ("cpu", None), "neuron": ("neuron", None),
               "cpu [CPU]": ("cpu", [cpu]), "neuron [CPU]": ("neuron", [cpu]),
               "neuron [CPU, PrivateUse1]": ("neuron", [cpu, pu1])}
    steps = {d: model_and_step(torch, d) for d in ("cpu", "neuron")}
    for _ in range(5):  # warm-up
        for step in steps.values():
            step()
    m = measure(configs, steps, args.rounds, args.steps)
    print(f"eager training step, medians of {args.rounds} x {args.steps} steps:")
    for name, us in m.items():
        print(f"  {name:<26} {us:8.1f} us")
    on = m["neuron [CPU, PrivateUse1]"]
    print(f"  profiling off: neuron / cpu {m['neuron'] / m['cpu']:.2f}x")
    print(f"  profiling on:  neuron [CPU, PrivateUse1] / cpu [CPU] {on / m['cpu [CPU]']:.2f}x "
          "(target <= 1.5x)")
    print(f"  neuron on / off {on / m['neuron']:.2f}x, cpu on / off "
          f"{m['cpu [CPU]'] / m['cpu']:.2f}x, the device activity's own cost "
          f"{on / m['neuron [CPU]']:.2f}x")


if __name__ == "__main__":
    main()
