"""Allreduce benchmark: the project against torch's Gloo backend, Open MPI's
MPI_Allreduce (vader shared memory) and a single-thread memcpy, side by side
in one run, with ratios and the issues' targets checked.

    .venv/bin/python benchmarks/allreduce_bench.py --build build [--ranks 2 4 8 16]
    .venv/bin/python benchmarks/allreduce_bench.py --build build --ranks 16 --launch-rounds 8

Every figure is float32 sum, the slowest rank's average over 256 MiB worth
of timed iterations (5 to 50) after 2 warm-up ones (8 bytes: 100000 after
1000, Gloo 200 after 20); busbw follows nccl-tests (2(n-1)/n x algbw).
Targets: for 1-64 MiB at 2, 4, 8 and 16 ranks busbw >= 1.5x Open MPI
(registered) and >= 3x Gloo in all four of the project's columns; 8-byte
latency at 2 ranks <= Open MPI's; 64 MiB at 2 ranks >= 40% of memcpy
bandwidth.

The project runs four ways: neuron-cc-perf on ordinary buffers (staged
through the shared windows) and on registered buffers (-R, as nccl-tests'
-R: the direct allreduce works in place), and torch.distributed with
backend "neuron" on ordinary tensors and on tensors in registered shared
memory (NEURON_SHARED_TENSORS=1). Gloo is torch's own (the installed
PyTorch's).

The 8-byte latency target is checked on paired runs at 2 ranks: the project
and Open MPI alternate --latency-rounds times (100000 operations each) and
the medians are compared. This machine's two vCPUs move between states in
which a cache line crosses between them in ~50 ns or ~200 ns, for seconds
at a time; alternating keeps one library from getting the slow minutes.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

SIZES = [8, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def parse(prefix, text):
    """{bytes: (us, busbw)} from lines '<prefix> bytes us busbw'."""
    out = {}
    for line in text.splitlines():
        m = re.search(rf"{prefix} (\d+) ([\d.]+) ([\d.]+)", line)
        if m:
            out[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return out


def ours(build, n, registered, sizes=SIZES):
    out = {}
    for size in sizes:
        iterations, warmup = (("100000", "1000") if size <= 64 << 10 else
                              (str(min(50, max(5, (256 << 20) // size))), "2"))
        text = run([f"{build}/launcher/neuronrun", "-n", str(n),
                    f"{build}/collectives/neuron-cc-perf", "-b", str(size), "-e", str(size),
                    "-n", iterations, "-w", warmup] + (["-R"] if registered else []))
        for line in text.splitlines():
            cols = line.split()
            if len(cols) >= 7 and cols[2].isdigit():
                out[int(cols[2])] = (float(cols[4]), float(cols[6]))
    return out


def torch_allreduce(build, n, python, backend, shared=False, sizes=SIZES):
    script = os.path.join(HERE, "scripts", "torch_allreduce.py")
    env = dict(os.environ, NEURON_SHARED_TENSORS="1" if shared else "0")
    text = run([f"{build}/launcher/neuronrun", "-n", str(n), "--python", python, script,
                backend] + [str(s) for s in sizes], env=env)
    return parse(backend, text)


def torch_direct(build, n, python, size):
    """torch_allreduce.py's neuron figure for `size` with the n ranks started
    directly (env://, as a user's own script or scheduler would), not by
    neuronrun: the store is made here on port 0 and the ranks join it as
    torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE)."""
    import datetime
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, n, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=600))
    script = os.path.join(HERE, "scripts", "torch_allreduce.py")
    pythonpath = os.pathsep.join(filter(None, [os.path.join(build, "python"),
                                               os.environ.get("PYTHONPATH")]))
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                   RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   TORCHELASTIC_USE_AGENT_STORE="True", PYTHONPATH=pythonpath,
                   NEURON_SHARED_TENSORS="0")
        procs.append(subprocess.Popen([python, script, "neuron", str(size)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"direct launch failed: {outputs}")
    return parse("neuron", outputs[0][0])[size][0]


def launch_compare(build, n, python, size, rounds):
    """[(neuronrun us, direct us)] of the torch neuron allreduce of `size`
    at n ranks, the two launches alternating."""
    return [(torch_allreduce(build, n, python, "neuron", sizes=[size])[size][0],
             torch_direct(build, n, python, size)) for _ in range(rounds)]


def mpi(build, n, sizes=SIZES):
    cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--allow-run-as-root",
           "--mca", "btl", "self,vader", f"{build}/benchmarks/mpi_allreduce"]
    return parse("mpi", run(cmd + [str(s) for s in sizes]))


def latency_pairs(build, rounds):
    """[(ours us, mpi us)] of 8-byte allreduces at 2 ranks, alternating."""
    pairs = []
    for _ in range(rounds):
        a = ours(build, 2, False, sizes=[8])[8][0]
        m = mpi(build, 2, sizes=[8])[8][0]
        pairs.append((a, m))
    return pairs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--latency-rounds", type=int, default=7,
                   help="paired 8-byte runs at 2 ranks (the latency target's figures)")
    p.add_argument("--launch-rounds", type=int, default=0,
                   help="only compare launches: the torch neuron allreduce of 64 MiB at the "
                        "largest --ranks under neuronrun and started directly (env://), "
                        "alternating this many times")
    args = p.parse_args()
    if args.launch_rounds > 0:
        report_launches(launch_compare(args.build, max(args.ranks), args.python, 64 << 20,
                                       args.launch_rounds), max(args.ranks))
        return

    memcpy = float(run([f"{args.build}/benchmarks/memcpy_bandwidth", str(64 << 20)]).split()[2])
    print(f"single-thread memcpy, 64 MiB: {memcpy:.2f} GB/s\n")
    columns = ("cc-perf", "cc-perf -R", "torch", "torch shared")
    print(f"{'ranks':>5} {'size':>9} | " + " | ".join(f"{c:>12} {'busbw':>7}" for c in columns) +
          f" | {'gloo us':>9} {'busbw':>7} | {'mpi us':>9} {'busbw':>7} | " +
          " ".join(f"{'x gloo':>6}" for _ in columns) + f" {'-R x mpi':>8}")
    misses = []
    for n in args.ranks:
        runs = [ours(args.build, n, False), ours(args.build, n, True),
                torch_allreduce(args.build, n, args.python, "neuron"),
                torch_allreduce(args.build, n, args.python, "neuron", shared=True)]
        g = torch_allreduce(args.build, n, args.python, "gloo")
        m = mpi(args.build, n)
        for size in SIZES:
            figures = [r[size] for r in runs]
            (gu, gb), (mu, mb) = g[size], m[size]
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} B"
            if size >= 1 << 20:  # bandwidth: ours / peer
                x_gloo = [b / gb for _, b in figures]
                x_mpi = figures[1][1] / mb
                for column, x in zip(columns, x_gloo):
                    if x < 3:
                        misses.append(f"{n} ranks {label} {column}: {x:.2f}x gloo (target 3x)")
                if x_mpi < 1.5:
                    misses.append(f"{n} ranks {label} -R: {x_mpi:.2f}x mpi (target 1.5x)")
            else:  # latency: ratio of times, peer / ours (> 1: we are faster)
                x_gloo = [gu / u for u, _ in figures]
                x_mpi = mu / figures[1][0]
            print(f"{n:>5} {label:>9} | " +
                  " | ".join(f"{u:>12.3f} {b:>7.3f}" for u, b in figures) +
                  f" | {gu:>9.1f} {gb:>7.3f} | {mu:>9.3f} {mb:>7.3f} | " +
                  " ".join(f"{x:>6.2f}" for x in x_gloo) + f" {x_mpi:>8.2f}")
        if n == 2:
            frac = runs[1][64 << 20][1] / memcpy
            print(f"{'':>5} 64 MiB at 2 ranks (-R): busbw = {frac:.0%} of memcpy "
                  f"(staged: {runs[0][64 << 20][1] / memcpy:.0%})")
            if frac < 0.4:
                misses.append(f"64 MiB at 2 ranks (-R): {frac:.0%} of memcpy (target 40%)")
    print("\nratios: busbw ours/peer for MiB sizes; time peer/ours for 8 B (> 1 is better); "
          "-R: registered buffers; torch: torch.distributed with backend neuron")
    if args.latency_rounds > 0:
        pairs = latency_pairs(args.build, args.latency_rounds)
        print("\n8-byte allreduce at 2 ranks, paired runs (us, ours / mpi): " +
              ", ".join(f"{a:.3f} / {m:.3f}" for a, m in pairs))
        a, m = (statistics.median(x) for x in zip(*pairs))
        wins = sum(1 for x, y in pairs if x <= y)
        print(f"medians: ours {a:.3f} us, mpi {m:.3f} us ({m / a:.2f}x); "
              f"ours <= mpi in {wins} of {len(pairs)} pairs")
        if a > m:
            misses.append(f"8 B latency at 2 ranks (paired medians): {a:.3f} us vs mpi {m:.3f} us")
    print("targets missed:" if misses else "all targets met")
    for miss in misses:
        print("  " + miss)


def report_launches(pairs, n):
    print(f"torch neuron allreduce, 64 MiB, {n} ranks, us per op (neuronrun / direct env://):")
    print("  " + ", ".join(f"{a:.0f} / {d:.0f}" for a, d in pairs))
    for name, figures in (("neuronrun", [a for a, _ in pairs]), ("direct", [d for _, d in pairs])):
        print(f"  {name:>9}: best {min(figures):.0f}, median {statistics.median(figures):.0f}")
    a, d = (statistics.median(x) for x in zip(*pairs))
    print(f"  medians neuronrun / direct: {a / d:.2f}x (<= 1: neuronrun no slower)")


if __name__ == "__main__":
    main()
