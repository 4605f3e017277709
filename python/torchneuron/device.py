"""``torch.neuron``: the device module of the "neuron" device.

torchneuron registers it as PyTorch's device module for PrivateUse1, renamed
"neuron" (``torch._register_device_module``), so code written against
``torch.cuda``'s shape, or against ``torch.accelerator``, runs on it::

    torch.neuron.device_count()            # 64 on a trn2 node at LNC=2
    torch.neuron.set_device(local_rank)    # or torch.accelerator.set_device_index
    x = torch.randn(8, device="neuron")
    torch.neuron.memory_allocated()        # bytes of live neuron tensors
    torch.neuron.max_memory_allocated()

Devices are the node's logical NeuronCores as the topology defines them
(docs/device.md); their memory is host memory accounted against the
device's HBM capacity. Operations run synchronously, so streams and events
exist for code that uses them (DDP, FSDP2) and are always complete; an
event records the simulated compute clock, so ``elapsed_time`` gives
modelled milliseconds.
"""

import collections
import contextlib

import torch

from . import _C

__all__ = [
    "Event", "Stream", "adaptive_eager", "adaptive_eager_stats", "current_device", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "empty_cache", "get_amp_supported_dtype",
    "get_device_name", "get_device_properties", "get_rng_state", "get_rng_state_all",
    "initial_seed", "is_adaptive_eager_enabled", "is_available", "is_bf16_supported", "is_initialized", "manual_seed",
    "manual_seed_all", "max_memory_allocated", "max_memory_reserved", "memory_allocated",
    "mem_get_info", "memory", "memory_phase", "memory_phase_peaks", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_adaptive_eager_stats", "reset_peak_memory_stats", "seed", "seed_all",
    "set_device", "set_memory_phase", "set_rng_state", "set_rng_state_all", "set_stream", "stream",
    "synchronize",
]


def _index(device=None, what="device"):
    """The device index `device` names (None: the current device), checked."""
    if device is None:
        return _C._current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"{what}: expected a neuron device, got {device}")
        if device.index is None:
            return _C._current_device()
        device = device.index
    return _C._check_device(int(device), what)


def is_available():
    """True: the simulated device is always there."""
    return _C._device_count() > 0


def is_initialized():
    return True


def _lazy_init():
    """Nothing to initialize lazily (torch calls it for some devices)."""


def _is_in_bad_fork():
    return False


def device_count():
    """The "neuron" devices this process sees: the node's logical NeuronCores
    (NEURON_RT_VISIBLE_CORES narrows them)."""
    return _C._device_count()


def current_device():
    return _C._current_device()


def set_device(device):
    """Makes `device` (index, "neuron:N" or torch.device) the calling
    thread's current device."""
    _C._set_device(_index(device, "set_device"))


class device:
    """Context manager that changes the current device, as torch.cuda.device."""

    def __init__(self, device):
        self.index = -1 if device is None else _index(device, "device")
        self.previous = -1

    def __enter__(self):
        self.previous = _C._current_device()
        if self.index >= 0:
            _C._set_device(self.index)

    def __exit__(self, *exc):
        _C._set_device(self.previous)
        return False


def synchronize(device=None):
    """Waits for the device's work: operations run synchronously, so there is
    none left; checks the index. Adaptive eager's open region is priced
    (a flush point, reason "sync")."""
    _index(device, "synchronize")
    _C._adaptive_eager_flush("sync")


def get_device_name(device=None):
    _index(device, "get_device_name")
    return _C._device_name()


class _Properties:
    def __init__(self, name, total_memory):
        self.name = name
        self.total_memory = total_memory
        self.type = "neuron"

    def __repr__(self):
        return f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory >> 20}MB)"


def get_device_properties(device=None):
    stats = _C._memory_stats(_index(device, "get_device_properties"))
    return _Properties(_C._device_name(), stats["capacity_bytes"])


def get_amp_supported_dtype():
    """The dtypes torch.autocast("neuron", dtype=...) accepts."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation=True):
    return True


# Streams and events: torch's generic classes, on this device.

def Stream(device=None, priority=0, **kwargs):
    """A new stream on `device` (default: the current device)."""
    return torch.Stream(device=torch.device("neuron", _index(device, "Stream")),
                        priority=priority, **kwargs)


def Event(enable_timing=False, blocking=False, interprocess=False):
    """An event of the current device; ``elapsed_time`` between two recorded
    events is the modelled time between them, in milliseconds."""
    return torch.Event(device=torch.device("neuron", _C._current_device()),
                       enable_timing=enable_timing, blocking=blocking,
                       interprocess=interprocess)


def current_stream(device=None):
    return torch.accelerator.current_stream(torch.device("neuron", _index(device, "current_stream")))


def default_stream(device=None):
    current = current_stream(device)  # for its device type's number
    return torch.Stream(stream_id=0, device_index=current.device_index,
                        device_type=current.device_type)


def set_stream(stream):
    if stream is not None:
        torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream):
    """Makes `stream` current inside the block (None: no change)."""
    if stream is None:
        yield
        return
    previous = torch.accelerator.current_stream(stream.device)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


# Memory: the caching allocator's counters (CUDA's meaning), the same that
# torch.accelerator's memory calls read (the allocator is the device's
# c10::DeviceAllocator).

def memory_stats(device=None):
    """torch.accelerator.memory_stats()'s figures under its names, sorted,
    plus num_cache_hits and capacity_bytes."""
    stats = _C._memory_stats(_index(device, "memory_stats"))
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _C._reset_peak_memory_stats(_index(device, "reset_peak_memory_stats"))


def reset_accumulated_memory_stats(device=None):
    """Zeroes the cumulative counters (allocated, freed, device allocs...)."""
    _C._reset_accumulated_memory_stats(_index(device, "reset_accumulated_memory_stats"))


def mem_get_info(device=None):
    """(free, total) bytes: the capacity less what the allocator reserves."""
    return tuple(_C._mem_get_info(_index(device, "mem_get_info")))


def empty_cache():
    """Completes the frees waiting on stream use, then returns the cached
    blocks of every device to the system."""
    _C._empty_cache()


# The summary, the snapshot and the peaks by phase (device_memory.py);
# torch.neuron.memory is that module, as torch.cuda.memory is CUDA's.
from . import device_memory as memory  # noqa: E402
from .device_memory import (  # noqa: E402,F401
    memory_phase, memory_phase_peaks, memory_snapshot, memory_summary, set_memory_phase)

# CPU fallbacks with their source lines, for a region (fallback_report.py).
from .fallback_report import FallbackReport, FallbackRow, fallback_report  # noqa: E402,F401

# Adaptive eager: queued eager ops fused and priced per region (adaptive_eager.py).
from .adaptive_eager import (  # noqa: E402,F401
    adaptive_eager, adaptive_eager_stats, is_adaptive_eager_enabled, reset_adaptive_eager_stats)


# Random numbers: one generator per device, with the CPU's algorithm; its
# state is a seed and an offset (16 bytes, as CUDA's), which DTensor's RNG
# tracker and torch.random.fork_rng(device_type="neuron") move.

def _generators():
    global default_generators
    if not default_generators:
        default_generators = tuple(_C._default_generator(i) for i in range(device_count()))
    return default_generators


default_generators = ()  # torch.neuron.default_generators, made at first use


def manual_seed(seed):
    _generators()[current_device()].manual_seed(int(seed))


def manual_seed_all(seed):
    for g in _generators():
        g.manual_seed(int(seed))


def seed():
    _generators()[current_device()].seed()


def seed_all():
    s = _generators()[0].seed()
    manual_seed_all(s)


def initial_seed():
    return _generators()[current_device()].initial_seed()


def get_rng_state(device="neuron"):
    return _generators()[_index(device, "get_rng_state")].get_state()


def set_rng_state(new_state, device="neuron"):
    _generators()[_index(device, "set_rng_state")].set_state(new_state)


def get_rng_state_all():
    return [g.get_state() for g in _generators()]


def set_rng_state_all(new_states):
    for g, state in zip(_generators(), new_states):
        g.set_state(state)
