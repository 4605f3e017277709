"""neuronrun with real Python ranks that import torch and use torch.distributed.

Few and purposeful: each Python rank spends ~1.5 s of CPU importing torch.
"""
import os
import re
import subprocess
import sys
import time

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]


def run(args, timeout=300):
    start = time.monotonic()
    proc = subprocess.run([NEURONRUN] + args, capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - start


def test_torch_distributed_script_runs_unchanged():
    proc, _ = run(["-n", "4", os.path.join(SOURCE, "examples/01_allreduce_barrier.py")])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout
    seen = set()
    for line in lines:
        m = re.fullmatch(r"\[rank (\d)\]: rank (\d)/4 on chip (\d): all_reduce of 1024 "
                         r"floats = 10, expected 10: ok", line)
        assert m, line
        assert m.group(1) == m.group(2) == m.group(3)
        seen.add(int(m.group(1)))
    assert seen == {0, 1, 2, 3}


def test_torchrun_starts_the_same_script():
    # PyTorch's own launcher, the package on PYTHONPATH as `make install` puts it.
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(NEURONRUN), "..", "python"))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2",
                           os.path.join(SOURCE, "examples/01_allreduce_barrier.py")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # torchrun passes the ranks' output through unprefixed, and two ranks'
    # lines may run together.
    ranks = re.findall(r"rank (\d)/2 on chip \?: all_reduce of 1024 floats = 3, expected 3: ok",
                       proc.stdout)
    assert sorted(ranks) == ["0", "1"], proc.stdout


def test_a_torchrun_command_line_runs_a_module():
    # As copied from a README: torchrun's spellings, a module, no script path.
    proc, _ = run(["--standalone", "--nproc_per_node=2", "--rdzv_backend", "c10d",
                   "-m", "platform", "--terse"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = subprocess.run([sys.executable, "-m", "platform", "--terse"], capture_output=True,
                          text=True).stdout.strip()
    assert sorted(proc.stdout.splitlines()) == [f"[rank 0]: {want}", f"[rank 1]: {want}"], \
        proc.stdout


def test_python_exception_is_summarised_and_the_job_fails_fast():
    script = os.path.join(SOURCE, "tests/python/scripts/raise_on_rank.py")
    proc, elapsed = run(["-n", "3", "--grace-period", "3", script, "1"])
    assert proc.returncode == 1, proc.stderr
    assert "neuronrun: job failed: rank 1 (node 0" in proc.stderr
    assert "exited with code 1" in proc.stderr
    assert "neuronrun:   ValueError: boom on rank 1" in proc.stderr
    assert "neuronrun:   Traceback (most recent call last):" in proc.stderr
    # The other ranks were blocked in all_reduce with a 300 s timeout; the job
    # still ends within the grace period of the failure.
    assert elapsed < 60, elapsed


def test_ranks_import_torchneuron_without_installing():
    proc, _ = run(["-n", "2", sys.executable, "-c",
                   "import torchneuron; print(torchneuron.__version__)"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[rank 0]: 0.1.0", "[rank 1]: 0.1.0"]


def test_a_topology_whose_faults_cut_the_ranks_apart_is_refused_up_front(tmp_path):
    topology = tmp_path / "cut.textproto"
    topology.write_text(
        'chips_per_node: 2 torus_dims: [2] ranks_per_chip: 1\n'
        'intra_node_link { bandwidth_gbps: 100 latency_us: 2 }\n'
        'inter_node_link { bandwidth_gbps: 25 latency_us: 15 }\n'
        'faults { from_chip: 0 to_chip: 1 down: true }\n')
    proc, _ = run(["-n", "2", "--topology", str(topology), "--no-python", "true"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the job's ranks cannot all reach each other: no route from chip 0 to chip 1" \
        in proc.stderr, proc.stderr


def test_bad_paths_and_numbers_are_usage_errors_naming_the_flag(tmp_path):
    proc, _ = run(["--log-dir", "/proc/nope/logs", "-n", "1", "--no-python", "true"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "neuronrun: error: --log-dir /proc/nope/logs: cannot create it" in proc.stderr
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir(mode=0o700)
    proc, _ = run(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1",
                   "--rdzv-secret-file", str(secret_dir), "-n", "1", "--no-python", "true"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"rendezvous secret file {secret_dir} is a directory" in proc.stderr
    proc, _ = run(["replay", str(tmp_path), "--nodes", "abc"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--nodes expects a whole number, got 'abc'" in proc.stderr
    proc, _ = run(["replay", str(tmp_path), "--tokens-per-rank-step", "nan"])
    assert proc.returncode == 2 and "--tokens-per-rank-step expects a number, got 'nan'" in proc.stderr


def test_a_trace_that_is_not_a_regular_file_is_refused_not_read_forever(tmp_path):
    os.mkfifo(tmp_path / "rank_0.pb")
    proc, _ = run(["replay", str(tmp_path)], timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rank_0.pb: not a regular file" in proc.stderr, proc.stderr
