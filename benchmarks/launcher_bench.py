"""Launcher benchmark: neuronrun against mpirun, side by side in one run.

Two workloads, each launched by both launchers in alternation:
  trivial  16 ranks of /bin/true (pure launch and teardown cost)
  torch    16 Python ranks that import torch, init a Gloo process group and
           barrier (what a real job pays before its first step); neuronrun
           runs it twice, its ranks fresh interpreters and forked from a
           zygote that imported torch (--preload torch)
Prints, for each, the median wall time of the whole job and the median CPU
time of the launcher process itself (its own overhead, without the ranks),
with the ratios neuronrun / mpirun.

    .venv/bin/python benchmarks/launcher_bench.py --neuronrun build/launcher/neuronrun
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def timed(cmd):
    """Runs cmd; returns (wall seconds, the launcher's own CPU seconds).

    The launcher's CPU time (user + system of that one process, not of the
    ranks it starts) is read from /proc/PID/stat while it is a zombie, after
    it exited but before it is reaped."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    elapsed = time.perf_counter() - start
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own_cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return elapsed, own_cpu


def mpirun_cmd(n, program, python=None):
    cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--allow-run-as-root",
           "--mca", "btl", "self,vader"]
    if python:
        cmd += ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
                "-x", "OMP_NUM_THREADS=1", python]
    return cmd + program


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--neuronrun", required=True)
    p.add_argument("-n", type=int, default=16, help="ranks per job")
    p.add_argument("--trivial-reps", type=int, default=20)
    p.add_argument("--torch-reps", type=int, default=3)
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    os.environ.pop("NEURON_PRELOAD", None)  # the plain rows start fresh interpreters

    script = os.path.join(HERE, "scripts", "torch_barrier.py")
    workloads = {
        "trivial (/bin/true)": (
            [args.neuronrun, "-n", str(args.n), "/bin/true"],
            mpirun_cmd(args.n, ["/bin/true"]),
            args.trivial_reps),
        "torch (import, init gloo, barrier)": (
            [args.neuronrun, "-n", str(args.n), "--python", args.python, script],
            None,  # built per repetition: each mpirun job needs its own port
            args.torch_reps),
        "torch, neuronrun --preload torch": (
            [args.neuronrun, "-n", str(args.n), "--python", args.python, "--preload", "torch",
             script],
            None,
            args.torch_reps),
    }
    print(f"{'workload':36} {'ranks':>5} | {'wall s':>7} {'mpirun':>7} {'ratio':>6} | "
          f"{'own cpu s':>9} {'mpirun':>7} {'ratio':>6}")
    for name, (ours, theirs, reps) in workloads.items():
        t_ours, t_theirs = [], []
        for _ in range(reps):  # alternate, so drift hits both alike
            t_ours.append(timed(ours))
            cmd = theirs or mpirun_cmd(args.n, [script], python=args.python)
            t_theirs.append(timed(cmd))
        wall_a = statistics.median(t for t, _ in t_ours)
        wall_b = statistics.median(t for t, _ in t_theirs)
        cpu_a = statistics.median(c for _, c in t_ours)
        cpu_b = statistics.median(c for _, c in t_theirs)
        cpu_ratio = f"{cpu_a / cpu_b:6.2f}" if cpu_b > 0 else "   n/a"
        print(f"{name:36} {args.n:>5} | {wall_a:>7.3f} {wall_b:>7.3f} "
              f"{wall_a / wall_b:>6.2f} | {cpu_a:>9.3f} {cpu_b:>7.3f} {cpu_ratio}")


if __name__ == "__main__":
    main()
