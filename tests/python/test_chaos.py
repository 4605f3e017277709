"""Chaos: a rank of a training job killed at a random point (during start-up,
the first collectives, DDP steps, or at the end): the job must end by itself
with neuronrun's summary naming that rank, leave no process of the job
behind and no shared-memory segment. Seeded: a failure names the seed and
the delay, and reruns the same way.
"""
import glob
import os
import random
import signal
import subprocess
import time

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
EXAMPLE = os.path.join(SOURCE, "examples/02_ddp_train.py")


def children(pid):
    """The pids of `pid`'s children (from /proc)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def rank_of(pid):
    """The RANK a process of the job was started with (None: not a rank)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    return int(env[b"RANK"]) if b"RANK" in env else None


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_rank_killed_at_a_random_point_ends_the_job_cleanly():
    rng = random.Random(20261201)
    shm_before = set(glob.glob("/dev/shm/neuron-*"))
    for trial in range(4):
        delay = rng.uniform(0.5, 6.0)
        victim = rng.randrange(4)
        # Far more steps than the job can take before the latest kill (about
        # 100 a second on this machine): it is always killed mid-run.
        job = subprocess.Popen([NEURONRUN, "-n", "4", EXAMPLE, "--steps", "4000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        ranks = sorted(p for p in children(job.pid) if rank_of(p) is not None)
        what = f"trial {trial}: delay {delay:.2f} s"
        if len(ranks) < 4 or job.poll() is not None:
            job.kill()
            job.communicate()
            raise AssertionError(f"{what}: the job was not running its 4 ranks: {ranks}")
        pid = ranks[victim]
        victim = rank_of(pid)
        what += f" (rank {victim}, pid {pid})"
        os.kill(pid, signal.SIGKILL)
        try:
            out, err = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            raise AssertionError(f"{what}: the job did not end within 120 s of the kill")
        assert job.returncode != 0, f"{what}: exit 0\n{err}"
        assert f"neuronrun: job failed: rank {victim} (node 0 on" in err and \
            "was killed by SIGKILL (signal 9) from outside" in err, f"{what}:\n{err}"
        # Survivors fail with an error, never an abort (an exception leaving a
        # thread or a destructor would say "terminate called").
        assert "terminate called" not in err and "SIGABRT" not in err, f"{what}:\n{err}"
        left = [p for p in ranks if alive(p)]
        assert not left, f"{what}: ranks {left} outlived the job"
    leaked = set(glob.glob("/dev/shm/neuron-*")) - shm_before
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"
