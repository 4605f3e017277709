"""The compiler path behind ``torch.compile(model, backend="neuron")``
(torchneuron.dynamo): aten-level FX graphs, as AOTAutograd hands them over,
become the compiler's IR, are compiled through the compile cache
(NEURON_CACHE_DIR) into executables and run by the runtime: real results on
the CPU, and the time the plan would take on a NeuronCore (metrics()).

    model = torchneuron.compile(torch.nn.Sequential(...))   # = torch.compile(..., backend="neuron")
    loss = model(x).sum(); loss.backward()        # trains: both passes compiled
    torchneuron.compiler.metrics()                # per graph: id, nodes, memory, time

A graph with an operator the device does not support yet runs on the CPU
instead (as eager PyTorch): this is reported per graph in metrics() (the
ops, their counts, the time, the bytes copied) and warned about once, never
silently. ``fullgraph=True`` makes it an error naming the op and the source
line; so does NEURON_FALLBACK=0 for every graph.
"""

import operator
import re
import threading
import time
import warnings

import torch

from . import _C
from . import compile_record as _compile_record
from .fx_ops import _kernel_of, _op_name, _source, _stack_line  # noqa: F401 (torchneuron.dynamo's)
from .fx_to_ir import to_ir
from .graph_views import _drop_unused_random_ops, _input_view, _view_outputs

_metrics = []
_lock = threading.Lock()


def _record(entry, gm, settings, text=None, graph=None):
    """Adds `entry` to metrics() with the graph's input signature and the
    settings it was compiled with, and writes its artifacts when asked
    (compile_record)."""
    entry["inputs"] = _compile_record.input_signature(gm)
    entry.update(settings or _compile_record.DEFAULT_SETTINGS)
    with _lock:
        _metrics.append(entry)
    _compile_record.write_artifacts(entry, gm, text, graph)


def _fallback(gm, name, ops, fullgraph, reason, settings=None):
    listed = ", ".join(f"{op}" + (f" ({src})" if src else "") for op, src in ops)
    if fullgraph or not _C._fallback_allowed():
        raise _C.InvalidUsageError(
            f"torchneuron.compile: graph {name} cannot run on the device: {reason}: {listed}"
            + (f" ({fullgraph})" if isinstance(fullgraph, str)
               else " (fullgraph=True)" if fullgraph else " (NEURON_FALLBACK=0)"))
    counts = {}
    for op, _ in ops:
        counts[op] = counts.get(op, 0) + 1
    entry = {"name": name, "graph_id": None, "compiled": False, "fallback_ops": counts,
             "fallback_reason": reason, "fallback_us": 0.0, "fallback_bytes": 0, "runs": 0}
    _record(entry, gm, settings)
    warnings.warn(f"torchneuron.compile: graph {name} runs on the CPU: {reason}: {listed}",
                  stacklevel=2)

    def run(args):
        entry["runs"] += 1
        return _timed_eager(gm, entry, args)
    run._boxed_call = True  # takes the argument list, as aot_autograd calls it
    return run


def _timed_eager(gm, entry, args):
    """Runs `gm` eagerly on the CPU, adding its time and the bytes handed to
    it to the graph's fallback figures in `entry`."""
    start = time.perf_counter()
    out = gm(*args)
    entry["fallback_us"] += (time.perf_counter() - start) * 1e6
    entry["fallback_bytes"] += sum(a.numel() * a.element_size() for a in args
                                   if isinstance(a, torch.Tensor))
    return out


# Native ops the device runs on float tensors only: an integer one (a
# cumsum of one-hot counts) is a CPU segment of its own rather than a
# device segment the compiler refuses whole.
_FLOAT_ONLY = frozenset({"aten.cumsum"})


def _on_device(node, native):
    """Whether `node` of an aten FX graph can run on the device: an aten op
    of the native table, within its dtypes (a getitem follows its source)."""
    if node.op != "call_function":
        return True
    if node.target is operator.getitem:
        return _on_device(node.args[0], native)
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    if _kernel_of(node.target) is not None:  # a kernel: one node of the plan
        return True
    op = _op_name(node.target)
    if op in _FLOAT_ONLY:
        meta = node.meta.get("tensor_meta")
        return getattr(meta, "dtype", None) in (torch.float32, torch.bfloat16, torch.float16)
    return op in native


def _collective(node):
    """Whether `node` is a functional collective (DTensor's, in captured
    graphs): it runs between the compiled segments on its process group's
    backend ("neuron": the fabric model times it), not as a CPU fallback."""
    return (isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace == "_c10d_functional")


def _kind(node, native):
    """Where a node of a split graph runs: "device", "collective" (eagerly,
    on its group's backend) or "cpu"."""
    if _on_device(node, native):
        return "device"
    if node.target is operator.getitem:
        return _kind(node.args[0], native)
    return "collective" if _collective(node) else "cpu"


def _refuse_unsupported(nodes, name, where):
    """Raises InvalidUsageError for the first node whose op the device's
    support table refuses (docs/operators.md, N), naming it, Neuron's
    reason and the source line: such an op is not a CPU fallback."""
    for n in nodes:
        if not isinstance(n.target, torch._ops.OpOverload):
            continue
        op = _op_name(n.target)
        reason = _C._unsupported_reason(op)
        if reason:
            source = _source(n, where)
            raise _C.InvalidUsageError(
                f"torchneuron.compile: graph {name}: {op}" + (f" ({source})" if source else "")
                + f" is not supported on the device: {reason}")


def _split_by_device(gm, name, where, fullgraph, settings=None):
    """Runs the graph as segments: maximal runs of native ops compiled for
    the device, the rest eagerly: functional collectives on their group's
    backend, other ops on the CPU (timed, warned about once; an error when
    `fullgraph` or NEURON_FALLBACK=0, as _fallback says). Returns the boxed
    callable, or None when the graph has one kind only (device or CPU)."""
    from torch.fx.passes.split_module import split_module
    native = set(_C._native_ops())
    work = [n for n in gm.graph.nodes if n.op == "call_function"]
    kind_of = {n: _kind(n, native) for n in work}
    if set(kind_of.values()) <= {"device"} or set(kind_of.values()) == {"cpu"}:
        return None  # nothing to split: the graph compiles, or runs on the CPU, whole
    ops = {"cpu": {}, "collective": {}}
    cpu_nodes = []
    for n, kind in kind_of.items():
        if kind != "device" and n.target is not operator.getitem:
            op = _op_name(n.target) if isinstance(n.target, torch._ops.OpOverload) else str(n.target)
            ops[kind][op] = ops[kind].get(op, 0) + 1
            if kind == "cpu":
                cpu_nodes.append((op, _source(n, where)))
    if cpu_nodes and (fullgraph or not _C._fallback_allowed()):
        _fallback(gm, name, cpu_nodes, fullgraph, "operators the device does not run",
                  settings)  # raises
    part, last, parts = 0, None, {}

    def partition(node):
        nonlocal part, last
        kind = kind_of.get(node, "device")  # not a call: with the device's segment
        if last is not None and kind != last:
            part += 1
        last = kind
        parts[part] = kind
        return part

    split = split_module(gm, None, partition)
    entry = {"name": name, "graph_id": None, "compiled": True, "fallback_ops": ops["cpu"],
             "collectives": ops["collective"],
             "fallback_reason": "operators the device does not run", "fallback_us": 0.0,
             "fallback_bytes": 0, "collective_us": 0.0, "runs": 0, "segments": len(parts)}
    _record(entry, gm, settings)
    if ops["cpu"]:  # collectives are the group's, timed by the fabric model: no fallback
        listed = ", ".join(f"{op} x{k}" for op, k in sorted(ops["cpu"].items()))
        on_device = sum(1 for k in parts.values() if k == "device")
        warnings.warn(f"torchneuron.compile: graph {name} runs {listed} on the CPU, the rest "
                      f"of it ({on_device} of {len(parts)} segments) on the device",
                      stacklevel=3)
    for index, kind in parts.items():
        sub = getattr(split, f"submod_{index}")
        segment = (_CompiledSegment(sub, f"{name}_seg{index}", where, fullgraph, settings)
                   if kind == "device" else _EagerSegment(sub, entry, kind))
        setattr(split, f"submod_{index}", segment)

    def run(args):
        entry["runs"] += 1
        return split(*args)
    run._boxed_call = True
    return run


class _CompiledSegment(torch.nn.Module):
    """A device segment of a split graph: compiled, called like the FX
    submodule it replaces (a single result, or a tuple). A segment the
    compiler refuses after all (an op's limits, e.g. integer arithmetic)
    runs on the CPU, reported as any fallback (an error under fullgraph)."""

    def __init__(self, gm, name, where, fullgraph, settings):
        super().__init__()
        single = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
        self.single = isinstance(single, torch.fx.Node)
        self.run = _compile_fx(gm, None, name, fullgraph, where, settings)

    def forward(self, *args):
        out = self.run(list(args))
        if not isinstance(out, list):  # the CPU fallback: the submodule's own result
            return out
        return out[0] if self.single else tuple(out)


class _EagerSegment(torch.nn.Module):
    """A segment of a split graph run eagerly: CPU operators (their time and
    the bytes handed to them counted as the graph's fallback) or functional
    collectives (their time as the graph's collective_us)."""

    def __init__(self, gm, entry, kind):
        super().__init__()
        self.gm, self.entry, self.kind = gm, entry, kind

    def forward(self, *args):
        if self.kind == "cpu":
            return _timed_eager(self.gm, self.entry, args)
        start = time.perf_counter()
        out = self.gm(*args)
        self.entry["collective_us"] += (time.perf_counter() - start) * 1e6
        return out


def _compile_fx(gm, example_inputs, name, fullgraph, where, settings=None):
    _drop_unused_random_ops(gm)
    _refuse_unsupported([n for n in gm.graph.nodes if n.op == "call_function"], name, where)
    collectives = any(_collective(n) for n in gm.graph.nodes if n.op == "call_function")
    if collectives or (not fullgraph and _C._fallback_allowed()):
        split = _split_by_device(gm, name, where, fullgraph, settings)
        if split is not None:
            return split
    returned, derived = _view_outputs(gm)
    logical = {returned[base] for kind, base, _ in derived.values() if kind == "output"}
    kernels = []
    text, order, outputs, unsupported, back = to_ir(gm, name, where, returned, logical,
                                                    kernels)
    if unsupported:
        return _fallback(gm, name, unsupported, fullgraph, "not expressible in the IR",
                         settings)
    try:
        start = time.perf_counter()
        graph = _C._compile_graph(text)
        seconds = time.perf_counter() - start
    except _C.InvalidUsageError as e:
        # "graph NAME: node I (OP) from SOURCE: ...": SOURCE is the IR
        # node's, the line to_ir wrote for it (node numbers count the nodes
        # left after the passes, not the FX graph's).
        found = re.search(r"node \d+ \(([^)]+)\)(?: from (.*?))?: ", str(e))
        ops = [(found.group(1), found.group(2) or where)] if found else [("?", where)]
        return _fallback(gm, name, ops, fullgraph, str(e), settings)
    info = graph.info()
    if info["cache_report"]:  # an explained miss (NEURON_CACHE_EXPLAIN=1), a damaged entry
        warnings.warn(f"torchneuron.compile: graph {name}: {info['cache_report']}",
                      stacklevel=2)
    entry = {"name": name, "compiled": True, "graph": graph, "fallback_ops": {},
             "fallback_us": 0.0, "fallback_bytes": 0, "compile_s": seconds,
             "compiled_here": info["cache"] == "compiled", "text": text, "kernels": kernels}
    _record(entry, gm, settings, text, graph)

    names = sorted({o for o in outputs if o is not None})
    results = [names.index(o) if o is not None else None for o in outputs]
    permuted = [(k, back[o]) for k, o in enumerate(outputs) if o in back]
    placeholders = {n: k for k, n in enumerate(n for n in gm.graph.nodes
                                               if n.op == "placeholder")}
    # A permuted input is passed with its memory order (graph.run permutes
    # it: contiguous, read in place, when it has the traced strides).
    positions = [i for i, _ in order]
    orders = [list(p) if p else [] for _, p in order] if any(p for _, p in order) else []
    made = [(k, kind, placeholders[base] if kind == "input" else base,
             _input_view(base, how) if kind == "input" else how)
            for k, (kind, base, how) in derived.items()]

    def run(args):
        # None: the run's dropout seed.
        inputs = [torch.randint(0, 2 ** 62, (), dtype=torch.int64) if i is None else args[i]
                  for i in positions]
        out = graph.run(inputs, orders)
        values = [out[j] if j is not None else None for j in results]
        for k, dims in permuted:  # returned in memory order: the traced layout, a view
            values[k] = values[k].permute(dims)
        for k, kind, base, how in made:
            values[k] = how(args[base]) if kind == "input" else values[base].view(how)
        return values
    run._boxed_call = True
    return run


def _signature(args, kwargs):
    """The static-shape signature of a call: each tensor's shape and dtype,
    other arguments by value."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), a.dtype)
        return ("value", repr(a))
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def compile(model, fullgraph=False, **kwargs):
    """``torch.compile(model, backend="neuron", fullgraph=fullgraph, **kwargs)``:
    `model` (an nn.Module or a function of tensors) with its forward and
    backward captured by TorchDynamo and compiled for the simulated
    NeuronCore (torchneuron.dynamo). The result is torch.compile's: an
    OptimizedModule sharing the module's parameters, or a function.

    Shapes are static: each new combination of input shapes and dtypes
    compiles new graphs (pad variable lengths with ``pad_to_bucket`` to bound
    their number). fullgraph: raise instead of breaking the graph or running
    operators the device lacks on the CPU."""
    return torch.compile(model, backend="neuron", fullgraph=fullgraph, **kwargs)


def pad_to_bucket(tensor, buckets, dim=-1, value=0):
    """Pads `tensor` along `dim` up to the smallest bucket length that holds
    it, so variable lengths (sequence lengths) compile once per bucket
    instead of once per length. Returns (padded, original length). Raises
    ValueError when the length exceeds the largest bucket.

        x, n = torchneuron.compiler.pad_to_bucket(tokens, [128, 256, 512], dim=1)
    """
    length = tensor.shape[dim]
    fits = [b for b in sorted(buckets) if b >= length]
    if not fits:
        raise ValueError(f"pad_to_bucket: length {length} along dim {dim} exceeds the largest "
                         f"bucket {max(buckets)}")
    pad = fits[0] - length
    if pad == 0:
        return tensor, length
    shape = list(tensor.shape)
    shape[dim] = pad
    filler = torch.full(shape, value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, filler], dim=dim), length


def metrics():
    """Per compiled graph: name, graph_id (the compile cache key), compiled
    (False: it runs on the CPU), how the compile cache served it ("cache":
    "memory hit", "disk hit" or "compiled"; "cache_report": why it compiled
    under NEURON_CACHE_EXPLAIN=1, or the damaged entry it replaced), node
    counts before and after the passes, planned SBUF bytes and the lower
    bound, modelled time and MFU of the last run, runs, and for CPU graphs
    the fallback ops, time and bytes; a split
    graph's row also counts its segments and the collectives run between
    them ("collectives"). Every row has the graph's input signature
    ("inputs": "float32[8, 16]", ...) and the settings it was compiled with
    (compile_record.settings: "mode", "options", "fullgraph"), and
    "artifacts", the directory of its files, under NEURON_COMPILE_ARTIFACTS;
    a compiled graph's row lists the torchneuron.nki kernels in its plan
    ("kernels": op, kernel, key, time_us, busy_us per engine, hbm_bytes)."""
    with _lock:
        entries = list(_metrics)
    return [_compile_record.metrics_row(e) for e in entries]


def export_timeline(path, name=None):
    """Writes the modelled timeline of a compiled graph (the last one, or the
    last named `name`, e.g. "Block_1_forward") as a Chrome trace: one track
    per engine, each instruction with its op and source."""
    with _lock:
        graphs = [e for e in _metrics if e.get("graph") is not None and
                  (name is None or e["name"] == name)]
    if not graphs:
        raise ValueError(f"torchneuron.compiler.export_timeline: no compiled graph "
                         f"{'named ' + repr(name) if name else 'yet'}")
    graphs[-1]["graph"].write_timeline(str(path))


def compile_times():
    """Seconds this process spent turning IR into executables: ``cold_s``
    for the graphs it compiled (compile cache misses), ``cached_s`` for
    those it found in the cache, over ``graphs`` graphs (tracing excluded)."""
    with _lock:
        entries = [e for e in _metrics if e.get("graph") is not None]
    return {"cold_s": sum(e["compile_s"] for e in entries if e["compiled_here"]),
            "cached_s": sum(e["compile_s"] for e in entries if not e["compiled_here"]),
            "graphs": len(entries)}


def measure_warm_compile():
    """Loads every graph this process compiled again from the disk compile
    cache, as a rerun would (the in-memory entries are dropped first), and
    returns the seconds it took; None without a disk cache
    (NEURON_CACHE_DIR empty)."""
    with _lock:
        texts = list(dict.fromkeys(e["text"] for e in _metrics if e.get("graph") is not None))
    if not texts:
        return 0.0
    _C._forget_compiled_in_memory()
    before = _C._cache_counters()
    start = time.perf_counter()
    for text in texts:
        _C._compile_graph(text)
    seconds = time.perf_counter() - start
    after = _C._cache_counters()
    if after["misses"] != before["misses"] or after["disk_hits"] == before["disk_hits"]:
        return None  # something was compiled again: no disk cache to load from
    return seconds


def cache_counters():
    """The process's compile cache counters: memory_hits, disk_hits, misses,
    evictions, corrupt."""
    return _C._cache_counters()
