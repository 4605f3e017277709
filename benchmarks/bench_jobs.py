"""Running a benchmark's worker mode as a neuronrun job (the drivers of
pipeline_bubble.py, zero_memory.py and ddp_bench.py)."""
import argparse
import os
import subprocess
import sys


def driver_args(description, sizes_flag, default_sizes, sizes_help):
    """The drivers' command line: --build, `sizes_flag` (the rank counts or
    stage counts to run) and the hidden --worker."""
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--build", default=os.path.join(here, "..", "build"))
    ap.add_argument(sizes_flag, type=int, nargs="+", default=default_sizes, help=sizes_help)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


def worker_rows(build, ranks, script, tag, worker_args=(), python=None):
    """Runs `script --worker [worker_args]` under `neuronrun -n ranks [--python
    python]` and returns the fields of every line "<tag> f1 f2 ..." it
    printed; exits with the job's output when it fails."""
    cmd = ([os.path.join(build, "launcher", "neuronrun"), "-n", str(ranks)] +
           (["--python", python] if python else []) +
           [os.path.abspath(script), "--worker", *worker_args])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return [line.split(f"{tag} ", 1)[1].split() for line in proc.stdout.splitlines()
            if f"{tag} " in line]
