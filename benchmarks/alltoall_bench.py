"""All-to-all benchmark: all_to_all_single with uneven splits through
torch.distributed, backend "neuron" against torch's Gloo, side by side in
one run, with the ratio and the target checked.

    .venv/bin/python benchmarks/alltoall_bench.py --build build [--ranks 2 4 8 16]

Each rank's send buffer is the size shown (float32), split unevenly over
its peers (benchmarks/scripts/torch_alltoall.py says how); each figure is
the slowest rank's average. Target (issue 47): >= 3x Gloo's busbw in every
cell of 1-64 MiB at 2, 4, 8 and 16 ranks. Exits 1 if a cell misses it.
"""
import argparse
import os
import re
import subprocess
import sys

SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def torch_alltoall(build, n, python, backend, sizes):
    """{bytes: (us, busbw)} of one job of n ranks."""
    script = os.path.join(HERE, "scripts", "torch_alltoall.py")
    text = run([f"{build}/launcher/neuronrun", "-n", str(n), "--python", python, script,
                backend] + [str(s) for s in sizes])
    out = {}
    for line in text.splitlines():
        m = re.search(rf"{backend} (\d+) ([\d.]+) ([\d.]+)", line)
        if m:
            out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES,
                        help="bytes per rank's send buffer")
    args = parser.parse_args()
    print(f"{'ranks':>5} {'bytes':>10} | {'neuron us':>10} {'busbw':>7} | "
          f"{'gloo us':>10} {'busbw':>7} | {'x gloo':>6}")
    misses = []
    for n in args.ranks:
        ours = torch_alltoall(args.build, n, args.python, "neuron", args.sizes)
        gloo = torch_alltoall(args.build, n, args.python, "gloo", args.sizes)
        for size in args.sizes:
            (u, b), (gu, gb) = ours[size], gloo[size]
            x = b / gb
            if x < 3:
                misses.append(f"{n} ranks {size} bytes: {x:.2f}x gloo (target 3x)")
            print(f"{n:>5} {size:>10} | {u:>10.1f} {b:>7.2f} | {gu:>10.1f} {gb:>7.2f} | {x:>6.2f}",
                  flush=True)
    for miss in misses:
        print("MISS", miss)
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
