#!/usr/bin/env python3
"""The cost of `neuronrun predict` itself: wall time, replay time and peak
memory against the number of ranks it replays (docs/performance.md,
"Prediction: what neuronrun predict costs").

Llama2-70B, TP 32 x PP 8 (256 microbatches per replica at 1,024 ranks),
ZeRO-1, sequence parallel, on trn1 nodes: the step is captured once, then
priced, laid out and replayed on 32, 128 and 512 nodes (1,024, 4,096 and
16,384 ranks; the global batch grows with the data-parallel size). There is
no peer: no other tool predicts a Trainium step.

    .venv/bin/python benchmarks/predict_cost.py --neuronrun build/launcher/neuronrun
"""
import argparse
import os
import re
import subprocess
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def layout():
    c = lambda p: os.path.join(SOURCE, "configs", p)  # noqa: E731
    return ["--model", c("models/llama2-70b.textproto"), "--seq", "4096", "--tp", "32",
            "--pp", "8", "--zero", "1", "--sequence-parallel",
            "--activation-checkpointing", "selective", "--attention", "core",
            "--topology", c("topologies/trn1-node.textproto"),
            "--device", c("devices/neuroncore-v2.textproto")]


def run(argv):
    """(wall s, stdout) of a command that must succeed."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err}")
    return wall, out


def peak_rss_mib(argv):
    """Runs `argv` under /usr/bin/time for its peak resident set."""
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True)
    return int(proc.stderr.strip().splitlines()[-1]) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--neuronrun", required=True)
    p.add_argument("--nodes", default="32,128,512")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        capture = os.path.join(tmp, "step.textproto")
        wall, _ = run([args.neuronrun, "predict", *layout(), "--nodes", "32",
                       "--global-batch", "1024", "--capture-out", capture])
        print(f"capture and prediction at 1024 ranks: {wall:.2f} s wall")
        print(f"{'ranks':>6} {'wall s':>8} {'replay s':>9} {'peak MiB':>9}  seq/s")
        for nodes in (int(n) for n in args.nodes.split(",")):
            argv = [args.neuronrun, "predict", *layout(), "--nodes", str(nodes),
                    "--global-batch", str(32 * nodes), "--capture", capture]
            wall, out = run(argv)
            replay = float(re.search(r"replayed \d+ ranks in ([0-9.]+) s", out).group(1))
            seq = float(re.search(r"^seq/s: ([0-9.]+)$", out, re.M).group(1))
            print(f"{nodes * 32:>6} {wall:>8.2f} {replay:>9.2f} {peak_rss_mib(argv):>9.0f}  "
                  f"{seq:.2f}")


if __name__ == "__main__":
    main()
