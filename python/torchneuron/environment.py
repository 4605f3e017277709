"""Where this rank sits in the job, from whichever launcher started it.

``torchneuron.init()`` reads, in this order:

* neuronrun or torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT.
* Open MPI (``mpirun -n 8 python train.py``): OMPI_COMM_WORLD_RANK, _SIZE,
  _LOCAL_RANK, _LOCAL_SIZE. The rendezvous host is MASTER_ADDR when set,
  else 127.0.0.1 when every rank is on one host, else the host mpirun runs
  on (from OMPI_MCA_orte_hnp_uri; rank 0 must run there, as with Open MPI's
  default mapping). The port is MASTER_PORT when set, else derived from the
  job id, so every rank computes the same one.
* Slurm (``srun python train.py``): SLURM_PROCID, SLURM_NTASKS,
  SLURM_LOCALID; the ranks on this node from SLURM_STEP_TASKS_PER_NODE or
  SLURM_TASKS_PER_NODE ("8(x2)", "4,3": one count per node, this node's by
  SLURM_NODEID), else SLURM_NTASKS_PER_NODE (set by --ntasks-per-node); the host is the first node of
  SLURM_JOB_NODELIST (or MASTER_ADDR), the port MASTER_PORT or one derived
  from SLURM_JOB_ID.
* Nothing: one process, rank 0 of 1, on a free local port.
"""

import datetime
import os
import re
import socket
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class LaunchEnvironment:
    """This rank's place in the job and the rendezvous address."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "neuronrun/torchrun", "openmpi", "slurm" or "single"


def _int(env, name):
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"torchneuron.init: {name}={env[name]!r} is not an integer") from None


def _port_from_job(job_id):
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 20000 + int(digits) % 10000


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_slurm_host(nodelist):
    """The first host of a Slurm node list: "n[03-05,9],m1" gives "n03"."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"torchneuron.init: cannot parse Slurm node list {nodelist!r}")
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def _openmpi(env):
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    size = _int(env, "OMPI_COMM_WORLD_SIZE")
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else size
    addr = env.get("MASTER_ADDR")
    if not addr:
        if local_size == size:
            addr = "127.0.0.1"
        else:
            uri = env.get("OMPI_MCA_orte_hnp_uri", "")
            found = re.search(r"tcp://([^:;]+):", uri)
            if not found:
                raise ValueError("torchneuron.init: a multi-node Open MPI job needs MASTER_ADDR "
                                 "(rank 0's host); OMPI_MCA_orte_hnp_uri does not name one")
            addr = found.group(1)
    port = _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else _port_from_job(
        env.get("OMPI_MCA_ess_base_jobid", env.get("PMIX_NAMESPACE", "0")))
    return LaunchEnvironment(rank, size, _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), local_size,
                             addr, port, "openmpi")


def slurm_tasks_on_node(spec, node):
    """The task count of node `node` in a Slurm per-node list such as
    "8(x2)" or "4(x2),3" (counts, each repeated x times); None when `spec`
    does not list that node."""
    counts = []
    for part in spec.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not found:
            return None
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else None


def _slurm(env):
    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_NTASKS")
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    local_size = None
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if local_size is None and env.get(name):
            local_size = slurm_tasks_on_node(env[name], node)
    if local_size is None:
        local_size = int(re.match(r"\d+", env.get("SLURM_NTASKS_PER_NODE", str(size))).group(0))
    nodelist = env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1"))
    addr = env.get("MASTER_ADDR") or first_slurm_host(nodelist)
    port = _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else _port_from_job(
        env.get("SLURM_JOB_ID", "0"))
    return LaunchEnvironment(rank, size, _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                             local_size, addr, port, "slurm")


def detect_environment(env=None):
    """Returns the LaunchEnvironment of this process (see the module doc)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        size = _int(env, "WORLD_SIZE")
        return LaunchEnvironment(
            _int(env, "RANK"), size, _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else size,
            env.get("MASTER_ADDR", "127.0.0.1"),
            _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else _port_from_job(0),
            "neuronrun/torchrun")
    if "OMPI_COMM_WORLD_RANK" in env:
        return _openmpi(env)
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _slurm(env)
    return LaunchEnvironment(0, 1, 0, 1, "127.0.0.1", _free_port(), "single")


def init(backend="neuron", timeout=datetime.timedelta(minutes=30), **kwargs):
    """Initialises torch.distributed for this rank and returns its
    LaunchEnvironment.

    Detects the launcher (neuronrun, torchrun, Open MPI, Slurm, or none),
    exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT so later code sees the torchrun contract, then calls
    ``torch.distributed.init_process_group(backend, init_method="env://")``
    with ``timeout`` and any further keyword arguments.
    """
    found = detect_environment()
    os.environ.update({
        "RANK": str(found.rank),
        "WORLD_SIZE": str(found.world_size),
        "LOCAL_RANK": str(found.local_rank),
        "LOCAL_WORLD_SIZE": str(found.local_world_size),
        "MASTER_ADDR": found.master_addr,
        "MASTER_PORT": str(found.master_port),
    })
    dist.init_process_group(backend, init_method="env://", rank=found.rank,
                            world_size=found.world_size, timeout=timeout, **kwargs)
    return found
