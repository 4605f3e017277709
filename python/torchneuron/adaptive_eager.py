"""Adaptive eager execution (docs/device.md, "Adaptive eager"): eager ops on
"neuron" queued into regions that the compiler fuses and prices as one
plan each, at the points that need their results. Off by default;
NEURON_ADAPTIVE_EAGER=1 turns it on from import, or in a program::

    torch.neuron.adaptive_eager(True)          # on from here
    with torch.neuron.adaptive_eager():        # on inside, the previous setting after
        loss = step(model, opt, x, y)
    torch.neuron.adaptive_eager_stats()        # regions, flush reasons, cache, time saved

Results are plain eager's, bit for bit: the eager kernels compute every op
at once and in order; only the simulated clock is charged differently (one
compiled plan per region instead of one eager cost per op).
"""

from . import _C

__all__ = ["adaptive_eager", "adaptive_eager_stats", "is_adaptive_eager_enabled",
           "reset_adaptive_eager_stats"]


class adaptive_eager:
    """Switches adaptive eager on (``enabled=True``) or off, at once, like
    ``torch.set_grad_enabled``: a plain call keeps the setting, a ``with``
    block restores the previous one at its end. Switching off, and leaving
    a block, prices the open region first."""

    def __init__(self, enabled=True):
        if not isinstance(enabled, bool):
            raise TypeError(f"adaptive_eager: enabled must be a bool, got {enabled!r}")
        self.previous = _C._set_adaptive_eager(enabled)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _C._adaptive_eager_flush("other")
        _C._set_adaptive_eager(self.previous)
        return False


def is_adaptive_eager_enabled():
    """Whether eager ops on "neuron" are queued into regions now."""
    return _C._adaptive_eager_enabled()


def adaptive_eager_stats():
    """Adaptive eager's counters since import or the last reset: ``regions``
    flushed and ``by_reason`` ("host_read": a copy to the CPU or .item();
    "host_write": a copy from the CPU; "collective"; "sync":
    torch.neuron.synchronize(), a stream or event sync, an event record,
    reading the simulated clock or the eager records, waiting on a
    collective's work; "unsupported_op": an op the compiler cannot
    express, charged as plain eager after the flush; "size": the
    NEURON_ADAPTIVE_EAGER_MAX_OPS limit; "other": switching off, a compiled
    graph's run, fabric.advance_compute), the ``ops`` they held and ``pending_ops``
    in the open region, ``cache_hits`` (regions priced without compiling:
    met before in this process, or found in the compile cache) and
    ``cache_misses`` (regions compiled), ``refused`` plans (the compiler
    could not take them: the op it names is charged as plain eager and the
    ops around it priced as regions of their own; ``last_refusal`` says
    why), ``kept_eager`` (regions whose plan is slower than their ops one
    by one: charged as plain eager),
    ``eager_us`` (what plain eager would have charged for their ops),
    ``fused_us`` (what was charged), ``saved_us`` (the difference) and
    ``pricing_wall_us`` (host time spent building and pricing regions).
    The open region is not flushed by reading them."""
    return _C._adaptive_eager_stats()


def reset_adaptive_eager_stats():
    """Zeroes the counters (the open region stays open)."""
    _C._reset_adaptive_eager_stats()
