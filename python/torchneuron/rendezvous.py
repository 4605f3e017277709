"""env:// through the job's authenticated store under neuronrun.

torch.distributed's env:// rendezvous makes rank 0 serve a TCPStore on
MASTER_PORT that any client on any interface can read and write. Under
neuronrun the job already has a store that authenticates every client with
the job's secret (NEURON_STORE_ENDPOINT, NEURON_JOB_SECRET); importing
torchneuron makes env:// use it there, so a job opens no unauthenticated
listener. Without neuronrun's variables (torchrun, mpirun, a test), env://
is torch's own, unchanged.

The keys live under ``torch/env/attempt<N>/`` (N: TORCHELASTIC_RESTART_COUNT),
so a restarted job never reads the keys of the attempt before it.
"""
import importlib
import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import torch.distributed as _dist

from . import _C

# The module (torch.distributed.rendezvous, as an attribute, is its function).
_rendezvous = importlib.import_module("torch.distributed.rendezvous")
_TORCH_ENV_HANDLER = _rendezvous._rendezvous_handlers["env"]


def _int_from(query, name, variable):
    if name in query:
        return int(query[name][0])
    value = os.environ.get(variable)
    if not value:
        raise ValueError(f"env:// rendezvous: environment variable {variable} expected, "
                         "but not set")
    return int(value)


def env_rendezvous_handler(url, timeout=timedelta(minutes=30), **kwargs):
    """torch's rendezvous handler for env://: the job's store under
    neuronrun, torch's TCPStore otherwise."""
    store = _C._connect_job_store(timeout)
    if store is None:
        yield from _TORCH_ENV_HANDLER(url, timeout, **kwargs)
        return
    query = parse_qs(urlparse(url).query)
    rank = _int_from(query, "rank", "RANK")
    world_size = _int_from(query, "world_size", "WORLD_SIZE")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    yield (_dist.PrefixStore(f"torch/env/attempt{attempt}", store), rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def install():
    """Makes env:// use env_rendezvous_handler (idempotent)."""
    _rendezvous._rendezvous_handlers["env"] = env_rendezvous_handler
