"""``torch.neuron``'s memory reports beyond the counters: the summary, the
snapshot and the peaks by phase (re-exported by torchneuron.device).

    print(torch.neuron.memory_summary())           # torch.cuda.memory_summary's table
    snap = torch.neuron.memory._snapshot()         # torch.cuda.memory._snapshot()'s form
    torch.cuda._memory_viz.segsum(snap)            # PyTorch's visualiser reads it
    with torch.neuron.memory_phase("warmup"):
        train_step()
    torch.neuron.memory_phase_peaks()              # {"warmup": {"allocated_bytes": ...}}

The figures are the caching allocator's (docs/device.md, "Memory"): blocks
are never split, so every segment holds one block, inactive_split is 0, and
no stack frames are recorded.

    torch.neuron.memory._record_memory_history()   # history for device_traces
    torch.cuda._memory_viz.trace_plot(torch.neuron.memory._snapshot())
"""

import collections
import contextlib
import pickle
import sys

from . import _C

_SIZE_METRICS = [
    ("allocated_bytes", "Allocated memory"),
    ("active_bytes", "Active memory"),
    ("requested_bytes", "Requested memory"),
    ("reserved_bytes", "HBM reserved memory"),
    ("inactive_split_bytes", "Non-releasable memory"),
]
_COUNT_METRICS = [
    ("allocation", "Allocations"),
    ("active", "Active allocs"),
    ("segment", "HBM reserved segments"),
    ("inactive_split", "Non-releasable allocs"),
]
_OVERSIZE_METRICS = [
    ("oversize_allocations", "Oversize allocations"),
    ("oversize_segments", "Oversize HBM segments"),
]


def _format_size(size, reference):
    """`size` in the unit torch.cuda.memory_summary picks for `reference`."""
    prefix = "B  "
    for unit in ["KiB", "MiB", "GiB", "TiB", "PiB"]:
        if reference < 768 * 1024:
            break
        prefix, size, reference = unit, size // 1024, reference / 1024
    return f"{size:6d} {prefix}"


def _format_count(count, reference):
    prefix = " "
    for unit in ["K", "M"]:
        if reference < 750 * 1000:
            break
        prefix, count, reference = unit, count // 1000, reference / 1000
    return f"{count:7d} {prefix} "


def _metric_rows(stats, key, name, formatter, pools):
    """The table rows of one metric: all pools, then (unless abbreviated)
    the large and the small pool, in the unit of the "all" row."""
    rows = []
    first = None
    for pool, label in pools:
        values = [stats[f"{key}.{pool}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        first = first or values
        cells = " | ".join(formatter(v, ref) for v, ref in zip(values, first))
        rows.append(f" {label:<21} | {cells} ")
    return rows


def format_memory_summary(stats, device=0, abbreviated=False):
    """torch.cuda.memory_summary's table for a memory_stats() dict."""
    rule, heavy = "-" * 75, "=" * 75
    lines = [heavy, f" {'':16} PyTorch Neuron memory summary, device ID {device:<15d} ", rule,
             f"  {'':7} Neuron OOMs: {stats['num_ooms']:<12d} | {'':6} device alloc retries: "
             f"{stats['num_alloc_retries']:<6d}  ", heavy,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for metrics, formatter in ((_SIZE_METRICS, _format_size), (_COUNT_METRICS, _format_count)):
        for key, name in metrics:
            pools = [("all", name)]
            if not abbreviated:
                pools += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
            lines.append(rule)
            lines += _metric_rows(stats, key, name, formatter, pools)
    for key, name in _OVERSIZE_METRICS:
        values = [stats[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        lines += [rule, f" {name:<21} | " + " | ".join(_format_count(v, v) for v in values) + " "]
    lines.append(heavy)
    return "|" + "|\n|".join(lines) + "|\n"


def memory_summary(device=None, abbreviated=False):
    """A printout of memory_stats(device) in torch.cuda.memory_summary's form
    (per metric: current, peak, total allocated, total freed; all pools,
    then the large and the small pool unless `abbreviated`)."""
    from .device import _index, memory_stats
    index = _index(device, "memory_summary")
    return format_memory_summary(memory_stats(index), index, abbreviated)


def memory_snapshot():
    """The allocator's segments on every device, in
    torch.cuda.memory_snapshot()'s form: one segment per block, each with its
    one block in state "active_allocated", "active_pending_free" (freed,
    waiting on stream use) or "inactive" (cached); frames are empty."""
    return _C._memory_snapshot()


def _record_memory_history(enabled="all", context="all", stacks="all",
                           max_entries=sys.maxsize, device=None):
    """Starts ("all", or True) or stops (None, "state", or False) recording
    every device's allocation history for _snapshot()'s "device_traces",
    keeping the last `max_entries` entries per device; stopping drops it.
    As torch.cuda.memory._record_memory_history, without stack frames:
    `context` and `stacks` are accepted and change nothing."""
    if enabled is True:
        enabled = "all"
    if enabled not in (None, False, "state", "all"):
        raise ValueError(f'_record_memory_history: enabled must be None, "state" or "all", '
                         f"got {enabled!r}")
    if enabled == "all" and max_entries < 1:
        raise ValueError(f"_record_memory_history: max_entries must be at least 1, got {max_entries}")
    _C._record_memory_history(min(max_entries, 2**62) if enabled == "all" else 0)


def _snapshot(device=None):
    """torch.cuda.memory._snapshot()'s dict, which torch.cuda._memory_viz
    reads: {"segments": memory_snapshot(), "device_traces": per device, the
    history recorded since _record_memory_history (empty when off)}."""
    return {"segments": memory_snapshot(), "device_traces": _C._memory_traces()}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    """Pickles _snapshot() to `filename`, for pytorch.org/memory_viz."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def set_memory_phase(phase, device=None):
    """Makes `phase` (a name: "load", "compile", "warmup", "step", ...; None
    or "": none) the current memory phase of `device` (default: the current
    device) and returns the previous one (None: none). Later allocations
    raise that phase's peaks (memory_phase_peaks)."""
    from .device import _index
    if phase is not None and not isinstance(phase, str):
        raise TypeError(f"set_memory_phase: phase must be a str or None, got {type(phase).__name__}")
    previous = _C._set_memory_phase(_index(device, "set_memory_phase"), phase or "")
    return previous or None


@contextlib.contextmanager
def memory_phase(phase, device=None):
    """Makes `phase` the current memory phase inside the block, then restores
    the previous one."""
    previous = set_memory_phase(phase, device)
    try:
        yield
    finally:
        set_memory_phase(previous, device)


def memory_phase_peaks(device=None):
    """{phase: {"allocated_bytes", "reserved_bytes", "active_bytes"}}: each
    phase's peak levels on `device`, in the order the phases were first
    entered. A phase's peaks start at the levels of the moment it was first
    entered; reset_peak_memory_stats does not change them."""
    from .device import _index
    return collections.OrderedDict(_C._memory_phase_peaks(_index(device, "memory_phase_peaks")))
