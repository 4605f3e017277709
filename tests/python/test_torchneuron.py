"""The torchneuron package and the "neuron" backend end to end, with real
Python ranks: init methods (env, file, tcp, Open MPI), statistics, errors,
a peer that dies, a collective that times out.

Few and purposeful: each Python rank spends ~1.5 s of CPU importing torch.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
SCENARIOS = os.path.join(SOURCE, "tests/python/scripts/backend_scenarios.py")


def rank_env(rank, size, port):
    # The store is this test's (TORCHELASTIC_USE_AGENT_STORE: every rank a
    # client, as under torchrun's agent).
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               TORCHELASTIC_USE_AGENT_STORE="True")
    env["PYTHONPATH"] = PACKAGE + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start_by_hand(scenario, size=2):
    """Starts `size` ranks without a launcher, their rendezvous a store this
    process serves on a port it bound (port 0: no other process can take it
    first); returns their outputs."""
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, SCENARIOS, scenario],
                              env=rank_env(r, size, store.port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(size)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out, err))
    del store
    return results


def test_env_file_and_tcp_init_methods_and_fabric_statistics(tmp_path):
    proc = subprocess.run([NEURONRUN, "-n", "2", SCENARIOS, "init_methods",
                           str(tmp_path / "store")],
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
    assert "Timed out" in m.group(2), out0  # as torch's own backends say it


def test_coalescing_sparse_allreduce_and_shutdown():
    """batch_isend_irecv with each rank listing its receive first (a single
    in-order lane would deadlock), the coalescing manager over
    all_gather_into_tensor / reduce_scatter_tensor, and the *_coalesced
    tensor collectives, against the reference values; a sparse allreduce
    against the dense sum; then shutdown()."""
    proc = subprocess.run([NEURONRUN, "-n", "3", SCENARIOS, "newer_ops"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(3):
        assert f"[rank {rank}]: ok newer ops" in proc.stdout, proc.stdout


def test_cmake_install_gives_an_importable_package(tmp_path):
    build = os.path.dirname(os.path.dirname(NEURONRUN))
    proc = subprocess.run(["cmake", "--install", build, "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-c",
                           "import torchneuron, torch.distributed as d; "
                           "print(torchneuron.__file__, 'NEURON' in d.Backend._plugins)"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(site / "torchneuron/__init__.py"), "True"], proc.stdout
    for command in ("neuronrun", "neuron-cc-perf"):
        assert os.access(tmp_path / "bin" / command, os.X_OK), command


def test_import_torch_autoloads_the_package_unless_turned_off():
    code = "import sys, torch; print('torchneuron' in sys.modules)"
    for autoload, want in (("1", "True"), ("0", "False")):
        env = dict(os.environ, PYTHONPATH=PACKAGE, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == want, (autoload, proc.stdout)


def test_launch_environment_detection_for_every_launcher():
    sys.path.insert(0, PACKAGE)
    from torchneuron.environment import detect_environment, first_slurm_host

    env = detect_environment({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                              "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n0",
                              "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_addr,
            env.master_port, env.launcher) == (3, 8, 1, 4, "n0", 29500, "neuronrun/torchrun")
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
            "OMPI_MCA_ess_base_jobid": "2071003137"}
    env = detect_environment(ompi)
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.launcher) == \
        (5, 8, 1, "127.0.0.1", "openmpi")
    assert env.master_port == 20000 + 2071003137 % 10000
    multi = dict(ompi, OMPI_COMM_WORLD_LOCAL_SIZE="4",
                 OMPI_MCA_orte_hnp_uri="2071003136.0;tcp://10.1.2.3:42003;tcp6://[fd00::2]:51761")
    assert detect_environment(multi).master_addr == "10.1.2.3"
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        detect_environment(dict(ompi, OMPI_COMM_WORLD_LOCAL_SIZE="4"))
    slurm = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
             "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_JOB_NODELIST": "trn[03-04]",
             "SLURM_JOB_ID": "777"}
    env = detect_environment(slurm)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_addr,
            env.master_port, env.launcher) == (9, 16, 1, 8, "trn03", 20777, "slurm")
    # Without --ntasks-per-node Slurm sets only SLURM_TASKS_PER_NODE (and the
    # step's): this node's count, by SLURM_NODEID.
    uneven = {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1",
              "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4,3",
              "SLURM_JOB_NODELIST": "trn[03-04]", "SLURM_JOB_ID": "777"}
    assert detect_environment(uneven).local_world_size == 3
    assert detect_environment(dict(uneven, SLURM_STEP_TASKS_PER_NODE="2(x2),3",
                                   SLURM_NODEID="2")).local_world_size == 3
    assert detect_environment(dict(uneven, SLURM_TASKS_PER_NODE="8(x2)",
                                   SLURM_NODEID="0")).local_world_size == 8
    assert first_slurm_host("a1,b[2-3]") == "a1"
    assert first_slurm_host("node[07,09-11]") == "node07"
    with pytest.raises(ValueError, match="WORLD_SIZE=.x"):
        detect_environment({"RANK": "0", "WORLD_SIZE": "x"})
    assert detect_environment({}).launcher == "single"
