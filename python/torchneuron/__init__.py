"""torchneuron: PyTorch distributed training on a simulated Trainium fabric.

Importing the package registers the "neuron" backend of torch.distributed::

    import torch.distributed as dist
    import torchneuron

    dist.init_process_group("neuron")     # or: torchneuron.init()
    dist.all_reduce(tensor)

Ranks started by neuronrun import it without installing anything: neuronrun
puts the build tree's package (build/python) on their PYTHONPATH. To install
it for other launchers, run ``cmake --install build`` (see docs/python.md).

``torch.compile(model, backend="neuron")`` (``torchneuron.compile(model)``
for short) runs a model's forward and backward as compiled graphs on the
simulated NeuronCore (see torchneuron.dynamo and torchneuron.compiler).

Errors raised by the backend derive from RuntimeError: NeuronError and its
subclasses InvalidUsageError (bad arguments), CollectiveTimeoutError (a wait
ran out of time) and PeerError (a peer failed or vanished). Their messages
name the rank, the group, the operation and its sequence number.
"""


def _autoload():
    """torch's device-backend autoload entry point (torch.backends group):
    importing the package registers everything. Defined before torch is
    imported: `import torchneuron` first imports torch, whose autoload then
    finds this module half-initialized and must still find this function."""


import atexit as _atexit  # noqa: E402

import torch as _torch  # noqa: E402
import torch.distributed as _dist  # noqa: E402

from . import _C
from ._C import (
    CollectiveTimeoutError,
    InvalidUsageError,
    NeuronError,
    PeerError,
    BackendNeuron,
)
_C._register_device()  # PrivateUse1 becomes "neuron": hooks, allocator, kernels
_torch.utils.rename_privateuse1_backend("neuron")
from . import device as _device_module  # noqa: E402
_torch._register_device_module("neuron", _device_module)
_torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
# Operations on "neuron" run on the calling thread: the importing thread's
# backward passes run there too, instead of hopping to autograd's device
# thread (torch.autograd.set_multithreading_enabled; CPU graphs never hop).
_torch._C._set_multithreading_enabled(False)

from . import compiler, fabric, rendezvous
from . import monitored_barrier as _monitored_barrier
from . import fallback_report as _fallback_report
from .adaptive_eager import adaptive_eager, adaptive_eager_stats
from .compiler import compile
from .environment import LaunchEnvironment, detect_environment, init

__version__ = "0.1.0"

_fallback_report._install_from_environment()  # NEURON_FALLBACK_REPORT=1: the whole run
_C._adaptive_eager_enabled()  # NEURON_ADAPTIVE_EAGER: read now, so a bad value fails the import

__all__ = [
    "CollectiveTimeoutError",
    "InvalidUsageError",
    "LaunchEnvironment",
    "NeuronError",
    "PeerError",
    "BackendNeuron",
    "adaptive_eager",
    "adaptive_eager_stats",
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


@_atexit.register
def _shutdown_at_exit():
    """Stops the progress threads of every neuron backend torch still holds
    while the interpreter can still serve them: a thread that frees a tensor
    during finalization would wait for the GIL forever, or end the process."""
    for pg in list(_dist.distributed_c10d._world.pg_map):
        try:
            backend = pg._get_backend(_torch.device("cpu"))
        except RuntimeError:
            continue
        if isinstance(backend, BackendNeuron):
            backend._shutdown()


def _default_to_the_backend_held(helper):
    """Wraps torch.distributed's group constructor (_new_process_group_helper).

    A group made with no backend named (``init_process_group()``, which
    ``init_device_mesh`` calls) gets Gloo as its default backend type
    whenever NCCL is not in the device map, even when the group holds only
    a "neuron" backend (the accelerator's) and no Gloo;
    destroy_process_group() then warns "No backend of type 1 found for
    Process Group with name gloo". A group made with "cpu:gloo,neuron:neuron"
    (as DTensorTestBase makes them) is meant to get CUSTOM, but torch 2.13
    compares the plugin's upper-case name ("NEURON") with the map's
    lower-case one and leaves it UNDEFINED (named "undefined"; "No backend
    of type 0" at destruction). Either group's default becomes the backend
    the accelerator holds (CUSTOM, as for a group made with "neuron"), as
    a "cpu:gloo,cuda:nccl" group's is NCCL."""
    def make(*args, **kwargs):
        pg, store = helper(*args, **kwargs)
        if not isinstance(pg, _dist.ProcessGroup):  # a rank outside the group
            return pg, store
        try:
            held = pg._get_backend(_torch.device("neuron"))
        except RuntimeError:
            return pg, store
        if isinstance(held, BackendNeuron) and pg.name() in ("gloo", "undefined"):
            pg._set_default_backend(_dist.ProcessGroup.BackendType.CUSTOM)
        return pg, store
    make._neuron_wrapped = helper
    return make


if not hasattr(_dist.distributed_c10d._new_process_group_helper, "_neuron_wrapped"):
    _dist.distributed_c10d._new_process_group_helper = _default_to_the_backend_held(
        _dist.distributed_c10d._new_process_group_helper)

rendezvous.install()  # env:// through the job's authenticated store under neuronrun
_monitored_barrier.install()  # dist.monitored_barrier serves neuron groups

if "NEURON" not in _dist.Backend._plugins:
    _dist.Backend.register_backend("neuron", _create_process_group, extended_api=True,
                                   devices=["cpu", "neuron"])
