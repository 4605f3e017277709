"""Statistics of the "neuron" backend on the two clocks.

Every collective a neuron process group runs is recorded with its wall time
on this machine and its modelled time on the simulated Trainium2 fabric
(docs/architecture.md, "Two clocks")::

    torchneuron.fabric.reset()
    ... train ...
    print(torchneuron.fabric.totals())        # {'operations': 12, 'modelled_us': ...}
    torchneuron.fabric.export_chrome_trace("trace.json")

``clock()`` gives this rank's two simulated clocks (compute, advanced by
compiled graphs and by eager operations on "neuron" tensors; collective, by
the fabric model). ``eager_records()`` lists the eager operations,
``graph_runs()`` the runs of compiled graphs. The other functions take
an optional ``group`` (default: the default group), which must be a neuron
process group. The statistics are local to the rank
and wait for the operations issued before the call to complete.
"""

import os as _os

import torch as _torch
import torch.distributed as _dist

from . import _C
from ._C import BackendNeuron
from .files import write_atomically


def _process_group(group):
    """The neuron backend of ``group`` (default: the default group)."""
    pg = group if group is not None else _dist.distributed_c10d._get_default_group()
    backend = pg
    if isinstance(pg, _dist.ProcessGroup):
        try:
            backend = pg._get_backend(_torch.device("cpu"))
        except RuntimeError:
            backend = None
    if not isinstance(backend, BackendNeuron):
        raise TypeError(
            f"torchneuron.fabric: group {pg!r} is not a neuron process group "
            f"(backend {_dist.get_backend(pg)!r}); create it with backend='neuron'")
    return backend


def records(group=None):
    """Returns one dict per completed collective (the latest 4096 of the
    group; totals() counts them all): op, sequence, bytes,
    wall_us, modelled_us, fabric_algorithm, arrival_us, start_us, end_us,
    algbw_gbps and busbw_gbps (nccl-tests definitions, modelled time), and
    registered (the allreduce worked in place on every rank's registered
    buffer: NEURON_SHARED_TENSORS=1, docs/collectives.md)."""
    return _process_group(group).records()


def totals(group=None):
    """Returns the cumulative counters: operations, bytes, wall_us,
    modelled_us and waited_us (simulated time spent waiting for peers)."""
    return _process_group(group).totals()


def reset(group=None):
    """Clears the records and counters of ``group``."""
    _process_group(group).reset_stats()


def eager_records():
    """Returns one dict per operation the "neuron" device ran eagerly (the
    latest 65536; eager_totals() counts them all): op, start_us (this
    rank's simulated compute clock when it was issued), modelled_us (the
    device model, docs/device.md), wall_us, bytes (read plus written),
    kind (matmul, vector, scalar, copy or unknown: how it was costed) and
    allocated (the device's allocated bytes after it)."""
    return _C._eager_records()


def eager_totals():
    """Returns the eager counters: operations, modelled_us, wall_us, bytes."""
    return _C._eager_totals()


def reset_eager():
    """Clears the eager records and counters."""
    _C._eager_reset()


def graph_runs():
    """Returns one dict per run of a compiled graph (the latest 65536):
    name, start_us (this rank's simulated compute clock when it was issued),
    modelled_us (its plan's time on the device model), wall_us (the
    executor's), and engines: its plan's instructions as (engine, op,
    start_us, end_us) from the run's start (a torchneuron.nki kernel in the
    plan once on each engine it holds, its op the kernel's key)."""
    runs, plans = _C._graph_runs()
    for r in runs:
        r["engines"] = plans[r.pop("plan")]
    return runs


def reset_graph_runs():
    """Clears the compiled-graph run log."""
    _C._graph_runs_reset()


def _collective_events(path, group):
    """The collectives of `group` (the default group when there is one) as
    Chrome events, and this rank (0 without a group)."""
    import json
    if group is None and not _dist.is_initialized():
        return [], 0
    rank = _dist.get_rank()
    _process_group(group).write_chrome_trace(path)
    with open(path, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    for e in events:
        e["tid"] = f"rank {rank} collectives"
    return events, rank


def _compute_events(rank):
    """Eager operations and compiled-graph runs, in issue order on the
    simulated clock, each once on the simulated clock and once on the wall
    clock (laid end to end: the wall track shows durations, not gaps); each
    run's engine timeline on a track per engine; the device memory after
    each eager operation."""
    work = [("op", r) for r in eager_records()] + [("graph", r) for r in graph_runs()]
    work.sort(key=lambda w: w[1]["start_us"])
    events, wall, track = [], 0.0, f"rank {rank} compute"
    for kind, r in work:
        if kind == "op":
            name, args = r["op"], {"bytes": r["bytes"], "kind": r["kind"]}
        else:
            name, args = f"graph {r['name']}", {"kind": "compiled graph"}
        events.append({"name": name, "ph": "X", "pid": "simulated", "tid": track,
                       "ts": r["start_us"], "dur": r["modelled_us"], "args": args})
        events.append({"name": name, "ph": "X", "pid": "wall", "tid": track, "ts": wall,
                       "dur": r["wall_us"], "args": args})
        wall += r["wall_us"]
        if kind == "op":
            events.append({"name": f"rank {rank} device memory", "ph": "C",
                           "pid": "simulated", "ts": r["start_us"] + r["modelled_us"],
                           "args": {"allocated_bytes": r["allocated"]}})
            continue
        for engine, op, begin, end in r["engines"]:
            events.append({"name": op, "ph": "X", "pid": "simulated",
                           "tid": f"rank {rank} {engine} engine", "ts": r["start_us"] + begin,
                           "dur": end - begin, "args": {"graph": r["name"]}})
    return events


def export_chrome_trace(path, group=None):
    """Writes this rank's trace to ``path`` (chrome://tracing, Perfetto): the
    collectives of ``group`` (default: the default group, when there is one),
    the eager operations of the "neuron" device and the runs of compiled
    graphs ("graph NAME"), each on its own track, once on the simulated
    clock (process "simulated") and once on the wall clock (process
    "wall"); each graph run's engine timeline (a track per engine, on the
    simulated clock); and the device memory allocated after each eager
    operation (a counter on the simulated clock)."""
    import json
    path = str(path)
    events, rank = _collective_events(path, group)
    events += _compute_events(rank)
    write_atomically(path, json.dumps({"traceEvents": events}))


_MAX_TRACE_BYTES = 1 << 30


def merge_chrome_traces(paths, out):
    """Writes one Chrome/Perfetto trace to ``out`` holding the events of the
    rank traces ``paths`` (export_chrome_trace's, whose tracks are named by
    rank), so a job's ranks are seen on one timeline. Raises ValueError
    naming a file that is not such a trace or is over 1 GiB."""
    import json
    events = []
    for path in map(str, paths):
        size = _os.path.getsize(path)
        if size > _MAX_TRACE_BYTES:
            raise ValueError(f"merge_chrome_traces: {path} has {size} bytes, over the "
                             f"{_MAX_TRACE_BYTES} a trace may have")
        with open(path, encoding="utf-8") as f:
            try:
                found = json.load(f)["traceEvents"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"merge_chrome_traces: {path} is not a Chrome trace "
                                 f"(no traceEvents list): {e}") from None
        if not isinstance(found, list):
            raise ValueError(f"merge_chrome_traces: {path}: traceEvents is not a list")
        events += found
    write_atomically(out, json.dumps({"traceEvents": events}))


def clock():
    """This rank's simulated clocks in microseconds: ``compute_us`` (advanced
    by compiled graphs, and by waiting for collectives) and
    ``collective_us`` (advanced by the fabric model), shared by every neuron
    process group of the process (docs/architecture.md, "Two clocks"); and
    ``charged_us``, what the device model charged the compute clock in all
    (compiled graphs, eager "neuron" operations, advance_compute), without
    the waits."""
    return _C._clock()


def reset_clock():
    """Sets both of this rank's simulated clocks back to 0."""
    _C._reset_clock()


def advance_compute(us):
    """Charges `us` microseconds of modelled device time to this rank's compute
    clock (work that ran eagerly on the CPU but would run on the device: the
    pipeline engine and the examples charge the device model's estimate)."""
    _C._advance_compute(float(us))


def start_trace():
    """Starts recording this rank's operation trace (docs/scaling.md,
    "Modelled cells"): every compute charge, collective and message of every
    neuron process group, in program order, until ``save_trace``. A trace
    replayed through the fabric model (``neuronrun replay``) gives the same
    modelled step times, on this job's topology or on a larger one."""
    _C._start_trace()


def mark(name):
    """Marks a point of the program in the trace being recorded (no-op when
    none is). Replay measures steps between ``"step_begin"`` and
    ``"step_end"`` marks."""
    _C._trace_mark(str(name))


def save_trace(directory, device_mesh=None):
    """Writes the recorded trace to ``directory/rank_<rank>.pb``, with the
    parallel layout: ``device_mesh``'s "tp", "pp" and "ep" dimensions (a
    torch DeviceMesh whose other dimension is data parallel, ranks ordered
    pp, dp, ep, tp as ``init_device_mesh`` orders them: expert parallelism
    is torchneuron.parallel.moe's, carved out of data parallelism), else
    that of ``torchneuron.parallel.initialize`` (tp = pp = 1 without one).
    An expert-parallel trace counts the ep x tp ranks of a replica as its
    tp positions (op_trace.proto's TraceLayout). Every rank calls it."""
    import os
    from .parallel import mesh
    rank, world = _dist.get_rank(), _dist.get_world_size()
    tp, pp, ep = (1, 1, 1)
    if device_mesh is not None:
        names = device_mesh.mesh_dim_names or ()
        order = [n for n in ("pp", "dp", "ep", "tp") if n in names]
        if list(names) != order:
            raise ValueError(f"save_trace: the mesh's dimensions {names} must be named from "
                             "pp, dp, ep and tp, in that order (ranks ordered pp, dp, ep, tp)")
        tp, pp, ep = (device_mesh[n].size() if n in names else 1 for n in ("tp", "pp", "ep"))
    elif mesh.is_initialized():
        tp, pp = mesh.get_layout().tp, mesh.get_layout().pp
    os.makedirs(directory, exist_ok=True)
    _C._save_trace(os.path.join(str(directory), f"rank_{rank}.pb"), rank, world, ep * tp, pp,
                   world // (ep * tp * pp), ep)
