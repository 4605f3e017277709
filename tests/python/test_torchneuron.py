"""The torchneuron package and the "neuron" backend end to end, with real
Python ranks: init methods (env, file, tcp, Open MPI), statistics, errors,
a peer that dies, a collective that times out.

Few and purposeful: each Python rank spends ~1.5 s of CPU importing torch.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
SCENARIOS = os.path.join(SOURCE, "tests/python/scripts/backend_scenarios.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, size, port):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_by_hand(scenario, size=2):
    """Starts `size` ranks without a launcher; returns their outputs."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, SCENARIOS, scenario], env=rank_env(r, size, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(size)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out, err))
    return results


def test_env_file_and_tcp_init_methods_and_fabric_statistics(tmp_path):
    proc = subprocess.run([NEURONRUN, "-n", "2", SCENARIOS, "init_methods",
                           str(tmp_path / "store"), str(free_port())],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        for label in ("env", "file", "tcp"):
            assert f"[rank {rank}]: ok {label}: rank {rank}/2 backend neuron" in proc.stdout, \
                proc.stdout
        assert f"[rank {rank}]: ok fabric: 2 ops" in proc.stdout, proc.stdout


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_open_mpi_starts_the_ranks():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run(["mpirun", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH",
                           sys.executable, SCENARIOS, "mpi"],
                          capture_output=True, text=True, timeout=300, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"ok mpi: rank {rank}/2 backend neuron" in proc.stdout, proc.stdout


def test_a_rank_that_dies_makes_the_others_raise_naming_it():
    (code0, out0, err0), (code1, _, _) = start_by_hand("peer_dies")
    assert code1 == 3
    assert code0 == 0, out0 + err0
    m = re.search(r"ok raised (\w+) after ([\d.]+) s: (.*)", out0)
    assert m, out0 + err0
    assert m.group(1) == "PeerError", out0
    assert float(m.group(2)) < 30, out0
    assert "rank 1" in m.group(3) and "allreduce #" in m.group(3), out0


def test_a_rank_that_dies_under_neuronrun_ends_the_job_with_a_summary():
    proc = subprocess.run([NEURONRUN, "-n", "2", SCENARIOS, "peer_dies"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "neuronrun: job failed: rank 1 (node 0" in proc.stderr, proc.stderr
    assert "exited with code 3" in proc.stderr, proc.stderr


def test_a_missing_rank_times_out_with_the_init_timeout():
    (code0, out0, err0), (code1, _, err1) = start_by_hand("timeout")
    assert code0 == 0 and code1 == 0, out0 + err0 + err1
    m = re.search(r"ok timed out after ([\d.]+) s: (.*)", out0)
    assert m, out0 + err0
    assert 1.5 < float(m.group(1)) < 10, out0
    assert "neuron rank 0" in m.group(2) and "allreduce #" in m.group(2), out0


def test_cmake_install_gives_an_importable_package(tmp_path):
    build = os.path.dirname(os.path.dirname(NEURONRUN))
    proc = subprocess.run(["cmake", "--install", build, "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/dist-packages"
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-c",
                           "import torchneuron, torch.distributed as d; "
                           "print(torchneuron.__file__, 'NEURON' in d.Backend._plugins)"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(site / "torchneuron/__init__.py"), "True"], proc.stdout
