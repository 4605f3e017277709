"""torchneuron: PyTorch distributed training on a simulated Trainium fabric.

Importing the package registers the "neuron" backend of torch.distributed::

    import torch.distributed as dist
    import torchneuron

    dist.init_process_group("neuron")     # or: torchneuron.init()
    dist.all_reduce(tensor)

Ranks started by neuronrun import it without installing anything: neuronrun
puts the build tree's package (build/python) on their PYTHONPATH. To install
it for other launchers, run ``cmake --install build`` (see docs/python.md).

``torchneuron.compile(model)`` runs a model's forward and backward as
compiled graphs on the simulated NeuronCore (see torchneuron.compiler).

Errors raised by the backend derive from RuntimeError: NeuronError and its
subclasses InvalidUsageError (bad arguments), CollectiveTimeoutError (a wait
ran out of time) and PeerError (a peer failed or vanished). Their messages
name the rank, the group, the operation and its sequence number.
"""

import torch.distributed as _dist

from . import _C
from ._C import (
    CollectiveTimeoutError,
    InvalidUsageError,
    NeuronError,
    PeerError,
    BackendNeuron,
)
from . import compiler, fabric
from .compiler import compile
from .environment import LaunchEnvironment, detect_environment, init

__version__ = "0.1.0"

__all__ = [
    "CollectiveTimeoutError",
    "InvalidUsageError",
    "LaunchEnvironment",
    "NeuronError",
    "PeerError",
    "BackendNeuron",
    "compile",
    "compiler",
    "detect_environment",
    "fabric",
    "init",
]


def _create_process_group(options, pg_options=None):
    """The creator torch.distributed calls for backend "neuron": a c10d
    Backend, which torch wraps in its ProcessGroup.

    ``options`` is torch's _DistributedBackendOptions (extended API): the
    group's store, rank, size, timeout, name and members' global ranks.
    """
    return BackendNeuron(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        list(options.global_ranks_in_group),
        options.group_id or "default_pg",
    )


if "NEURON" not in _dist.Backend._plugins:
    _dist.Backend.register_backend("neuron", _create_process_group, extended_api=True,
                                   devices=["cpu"])
