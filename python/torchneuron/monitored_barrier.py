"""``torch.distributed.monitored_barrier`` for "neuron" groups.

torch's Python function refuses every backend but Gloo before it reaches
the backend (ValueError), although the ProcessGroup method it then calls is
a backend's to implement, and the neuron backend implements it (a barrier
that names the ranks that did not reach it in time: "Rank 1 failed to pass
monitoredBarrier in 2000 ms"). ``install()`` makes ``dist.monitored_barrier``
serve neuron groups with torch's own argument handling, and hands every
other group to torch's function unchanged.
"""
import datetime

import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d

_torch_monitored_barrier = _c10d.monitored_barrier


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier, for neuron groups too (see torch's
    documentation: every rank waits for all, rank 0 reports the ranks that
    did not arrive within `timeout`, or the first of them)."""
    if group is None or group is _c10d.GroupMember.WORLD:
        pg = _c10d._get_default_group() if _dist.is_initialized() else None
    else:
        pg = group
    if pg is None or _c10d._rank_not_in_group(group) or _dist.get_backend(pg) != "neuron":
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    if timeout is None:
        timeout = _c10d._get_default_timeout("neuron")
    elif isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    _c10d._check_valid_timeout(timeout)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def install():
    _c10d.monitored_barrier = monitored_barrier
    _dist.monitored_barrier = monitored_barrier
