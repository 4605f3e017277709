"""The "neuron" backend against torch.distributed's contract, with 4 real
Python ranks under neuronrun: the c10d conformance matrix (--quick) and DDP
parity (bitwise). No skip: both fail while the backend is missing.

Few and purposeful: each Python rank spends ~1.5 s of CPU importing torch.
"""
import os
import re
import subprocess

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
SCRIPTS = os.path.join(SOURCE, "tests/python/scripts")


def run(script, *args, timeout=300, env=None):
    return subprocess.run([NEURONRUN, "-n", "4", os.path.join(SCRIPTS, script), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def test_every_collective_dtype_and_reduce_op_matches_gloo_and_the_reference():
    proc = run("c10d_conformance.py", "--backend", "neuron", "--quick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = re.findall(r"^\[rank (\d)\]: c10d conformance, backend neuron: (\d+) checks "
                           r"passed; (\d+) runs compared: (\d+) with gloo and the reference, "
                           r"(\d+) with the reference only$", proc.stdout, re.MULTILINE)
    assert sorted(int(s[0]) for s in summaries) == [0, 1, 2, 3], proc.stdout
    for _, checks, runs, with_gloo, reference_only in summaries:
        assert int(with_gloo) > 0 and int(reference_only) > 0, proc.stdout
        assert int(runs) == int(with_gloo) + int(reference_only)
    assert "gloo rejected" not in proc.stdout, proc.stdout


def test_unchanged_ddp_trains_bitwise_like_a_single_process():
    proc = run("ddp_parity.py", "--backend", "neuron")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "ddp parity" in line]
    assert len(lines) == 5, proc.stdout
    for case, line in zip("abcde", lines):
        assert re.fullmatch(rf"\[rank 0\]: torch ddp parity \({case}\) .*: 10 steps x 4 ranks, backend "
                            r"neuron: ok, \d+ checks bitwise equal to the reference", line), line


def test_ddp_on_shared_tensors_reduces_in_place_and_stays_bitwise():
    # NEURON_SHARED_TENSORS=1: the 2 MiB first-layer gradient and its bucket
    # are registered, so their allreduce works in place on every rank's
    # buffer; training must stay bitwise equal to the single-process reference.
    proc = run("ddp_parity.py", "--backend", "neuron", "--cases", "ab", "--in-features", "16384",
               env={"NEURON_SHARED_TENSORS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for case in "ab":
        assert re.search(rf"^\[rank 0\]: torch ddp parity \({case}\) .*: 10 steps x 4 ranks, "
                         r"backend neuron: ok, \d+ checks bitwise equal", proc.stdout,
                         re.MULTILINE), proc.stdout
    registered = re.search(r"registered allreduces: (\d+) of (\d+)", proc.stdout)
    assert registered and int(registered.group(1)) >= 20, proc.stdout  # a bucket per step, at least
