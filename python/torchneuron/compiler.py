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

# torch dtype -> the IR's name, from the project's one dtype list.
_DTYPES = {getattr(torch, name): ir for name, ir, _on_device in _C._dtypes()}

_metrics = []
_lock = threading.Lock()


class _Unsupported(Exception):
    pass


# The input a graph with dropout gets: each run's seed, drawn from torch's
# default generator (torch.manual_seed makes compiled dropout reproducible).
_SEED = "dropout_seed"
_RANDOM = ("aten.native_dropout", "aten.bernoulli_.float", "aten.bernoulli.p")

# Outputs a graph may leave unused (their gradient was not wanted), by op:
# output index -> the argument whose type it has.
_OUTPUT_LIKE = {
    "aten.native_layer_norm_backward": {0: 1, 1: 4, 2: 5},
    # (grad input, grad weight, grad bias [out channels])
    "aten.convolution_backward": {
        0: 1, 1: 2,
        2: lambda node: _type(node.args[2].meta["tensor_meta"], node.name).split("[")[0] +
        f"[{int(node.args[2].meta['tensor_meta'].shape[0])}]"},
}


# Ops whose .Tensor overload is not their default's tensor-operand form:
# clamp.Tensor takes tensor bounds, which the device's clamp does not.
_TENSOR_OVERLOAD_KEPT = frozenset({"clamp", "clamp_min", "clamp_max"})


def _op_name(target):
    """aten.mm for aten.mm.default; the overload kept where it matters
    (aten.sum.dim_IntList, aten.clamp.Tensor), dropped for the
    tensor-operand forms (aten.add.Tensor is aten.add)."""
    packet = target._overloadpacket.__name__
    overload = target._overloadname
    space = target.namespace  # aten, or e.g. _c10d_functional
    if overload == "default" or (overload == "Tensor" and packet not in _TENSOR_OVERLOAD_KEPT):
        return f"{space}.{packet}"
    return f"{space}.{packet}.{overload}"


def _type(meta, what):
    if not hasattr(meta, "shape") or not hasattr(meta, "dtype"):
        raise _Unsupported(f"{what} is not a single tensor")
    if meta.dtype not in _DTYPES:
        raise _Unsupported(f"{what} has dtype {meta.dtype}")
    return f"{_DTYPES[meta.dtype]}[{','.join(str(int(d)) for d in meta.shape)}]"


def _attribute(value):
    if isinstance(value, torch.dtype):
        if value not in _DTYPES:
            raise _Unsupported(f"dtype {value}")
        return f'"{_DTYPES[value]}"'
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return "[" + ", ".join(str(int(v)) for v in value) + "]"  # bools as 0/1
    raise _Unsupported(f"attribute {value!r}")


def _implied(key, value):
    """Keyword arguments every IR value satisfies: contiguous, strided, on
    the device (the CPU or "neuron", as eager sees it), not pinned."""
    if value in (torch.contiguous_format, torch.preserve_format, torch.strided):
        return True
    if isinstance(value, torch.device):
        return value.type in ("cpu", "neuron")
    return key == "pin_memory" and value is False


def _stack_line(node):
    """The last frame of `node`'s FX stack trace ('File "x.py", line 7, in
    f'), or ""."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    return lines[-1] if lines else ""


def _source(node, fallback=""):
    """The user's source line of `node`: the FX stack trace's last frame;
    where there is none (Dynamo records no frames inside torch.nn's own
    modules), the module it ran in ("module layers.0.norm (LayerNorm)"),
    then `fallback`, the captured graph's first source line."""
    line = _stack_line(node)
    if line:
        return line
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return fallback
    path, cls = list(stack.values())[-1]
    path = re.sub(r"\['([^']*)'\]", r".\1", re.sub(r"^L\['[^']*'\]\.?", "", str(path)))
    kind = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    module = f"module {path.lstrip('.')} ({kind})" if path else f"module {kind}"
    return f"{module}, {fallback}" if fallback else module


def _arg_operands(node, names):
    """The node's positional operands: tensors (IR names, in order; a list
    of tensors for stack and cat) and the other arguments as attributes
    named by the op's schema."""
    schema = node.target._schema.arguments
    tensors, attrs = [], []
    for i, arg in enumerate(node.args):
        if isinstance(arg, torch.fx.Node):
            tensors.append("%" + names[arg])
        elif (isinstance(arg, (list, tuple)) and arg
              and all(isinstance(a, torch.fx.Node) for a in arg)):
            tensors.extend("%" + names[a] for a in arg)  # stack, cat
        elif arg is not None:
            attrs.append(f"{schema[i].name} = {_attribute(arg)}")
    return tensors, attrs


def _kwarg_operands(node, names, tensors, attrs):
    """Appends the node's keyword operands (those every IR value does not
    already satisfy) to `tensors` and `attrs`."""
    for key, arg in node.kwargs.items():
        if isinstance(arg, torch.fx.Node):
            tensors.append("%" + names[arg])
        elif _implied(key, arg):
            continue
        elif arg is not None:
            attrs.append(f"{key} = {_attribute(arg)}")


def _output_types(node, op):
    """The IR types of a node with several outputs: from their getitem
    users, else (unused) from the argument they match or the fake values
    AOTAutograd traced."""
    items = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    returns = node.target._schema.returns
    count = len(returns)
    listed = count == 1 and str(returns[0].type) == "List[Tensor]"
    if listed:  # unbind: one tensor per index along `dim`, all alike
        shape = node.args[0].meta["tensor_meta"].shape
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        count = int(shape[dim])
    like = _OUTPUT_LIKE.get(op, {})

    def output_type(k):
        if k in items:
            return _type(items[k].meta.get("tensor_meta"), node.name)
        if listed and items:
            return _type(next(iter(items.values())).meta.get("tensor_meta"), node.name)
        if k in like:  # unused, typed as the argument it matches
            if callable(like[k]):
                return like[k](node)
            return _type(node.args[like[k]].meta.get("tensor_meta"), node.name)
        val = node.meta.get("val")  # the fake outputs AOTAutograd traced
        if isinstance(val, (list, tuple)) and k < len(val):
            return _type(val[k], node.name)
        raise _Unsupported("an output that is never used")
    return [output_type(k) for k in range(count)]


def _results(node, op, meta):
    """The IR declaration of the node's results, and whether it has
    several (read through getitem)."""
    if isinstance(meta, (list, tuple)) and not hasattr(meta, "shape"):  # unbind
        return ", ".join(f"%{node.name}_{k}: {_type(m, node.name)}"
                         for k, m in enumerate(meta)), True
    if meta is None:  # several outputs: their types are on the getitem users
        return ", ".join(f"%{node.name}_{k}: {t}"
                         for k, t in enumerate(_output_types(node, op))), True
    return f"%{node.name}: {_type(meta, node.name)}", False


def _stored_order(meta):
    """For a tensor whose strides lay it out densely in another order than
    its dims' (a transpose or permute of a contiguous tensor): its dims in
    memory order, p, so that tensor.permute(p) is contiguous. None for a
    contiguous tensor, one with a size-1 dim (whose stride says nothing),
    and one that is not dense."""
    shape, stride = getattr(meta, "shape", None), getattr(meta, "stride", None)
    if (shape is None or stride is None or len(shape) < 2 or len(stride) != len(shape)
            or any(int(d) < 2 for d in shape)):
        return None
    order = sorted(range(len(shape)), key=lambda d: -int(stride[d]))
    expected = 1
    for d in reversed(order):
        if int(stride[d]) != expected:
            return None
        expected *= int(shape[d])
    return order if order != list(range(len(shape))) else None


def _inverse(order):
    """The permutation that undoes `order`."""
    return [order.index(d) for d in range(len(order))]


class _Translation:
    """The state of one graph's translation to IR (to_ir)."""

    def __init__(self, where, returned=None, taken=(), logical=()):
        self.where = where
        self.taken = set(taken)  # the graph's names, which a stored value's name avoids
        self.logical = set(logical)  # returned nodes kept in their dims' order
        self.back = {}  # a returned value stored in memory order -> the dims that undo it
        self.returned = returned  # the values returned, when not the output node's
        self.inputs, self.lines, self.unsupported = [], [], []
        self.stored = []  # per input: its dims in memory order when not its own (_stored_order)
        self.names, self.multi = {}, set()
        self.outputs = None
        self.streams = 0  # random ops so far: each draws its own stream of the seed

    def placeholder(self, node, meta):
        """An input. One traced with a permuted dense layout (a transpose of
        a contiguous tensor: a saved weight's t(), say) is read as its bytes
        lie, an input of its memory order's shape, and the graph permutes it
        back: the passes fold that permute into a matmul that reads it (no
        copy where eager would have read the view; another reader takes a
        strided copy, as it would of a transposed value)."""
        declared = _type(meta, node.name)
        order = _stored_order(meta)
        self.stored.append(order)
        if order is None:
            self.inputs.append((node.name, f"%{node.name}: {declared}"))
            return
        stored, stored_type = self.in_memory_order(node.name, meta, order)
        self.inputs.append((stored, f"%{stored}: {stored_type}"))
        self.lines.append(f"  %{node.name}: {declared} = aten.permute(%{stored}) "
                          f"{{dims = [{', '.join(map(str, _inverse(order)))}]}}"
                          f"  # input {node.name}")

    def in_memory_order(self, name, meta, order):
        """The name and IR type of value `name` (`meta`) laid out in its
        memory order `order`: NAME_stored, unless the graph has that name."""
        stored = name + "_stored"
        while stored in self.taken:
            stored += "_"
        dims = ",".join(str(int(meta.shape[d])) for d in order)
        return stored, f"{_DTYPES[meta.dtype]}[{dims}]"

    def stored_output(self, node):
        """The IR value returned for `node`. A t, transpose or permute traced
        with a permuted dense layout (unless a derived view needs its dims'
        order) is returned in its memory order: a permute the passes fold
        into it (none left where its input is in order); the run makes the
        traced layout back as a view, as eager's is, so the next graph
        reads it as stored (placeholder) with no copy. Other values are
        returned in their dims' order, as the graph computes them."""
        name = self.names.get(node)
        if (name is None or node in self.logical or node.op == "placeholder"
                or not _view_of_first_arg(node, _LAYOUT)):
            return name
        order = _stored_order(node.meta.get("tensor_meta"))
        if order is None:
            return name
        stored, stored_type = self.in_memory_order(name, node.meta["tensor_meta"], order)
        if stored not in self.back:
            self.lines.append(f"  %{stored}: {stored_type} = aten.permute(%{name}) "
                              f"{{dims = [{', '.join(map(str, order))}]}}  # returned as stored")
            self.back[stored] = _inverse(order)
        return stored

    def call(self, node):
        """An aten op node as one IR line."""
        op = _op_name(node.target)
        try:
            tensors, attrs = _arg_operands(node, self.names)
            if op in _RANDOM:  # its random bits: the run's seed, a stream each
                if self.streams == 0:
                    self.inputs.append((_SEED, f"%{_SEED}: i64[]"))
                    self.stored.append(None)
                tensors.append("%" + _SEED)
                attrs.append(f"stream = {self.streams}")
                self.streams += 1
            _kwarg_operands(node, self.names, tensors, attrs)
            out, several = _results(node, op, node.meta.get("tensor_meta"))
            if several:
                self.multi.add(node)
            attr_text = " {" + ", ".join(attrs) + "}" if attrs else ""
            self.lines.append(f"  {out} = {op}({', '.join(tensors)}){attr_text}"
                              f"  # {_source(node, self.where)}")
            self.names[node] = node.name
        except (_Unsupported, KeyError):
            self.unsupported.append((op, _source(node, self.where)))

    def node(self, node):
        meta = node.meta.get("tensor_meta")
        if node.op == "placeholder":
            try:
                self.placeholder(node, meta)
            except _Unsupported as e:
                self.unsupported.append((f"input {node.name}", str(e)))
            self.names[node] = node.name
        elif node.op == "call_function" and node.target is operator.getitem:
            source, index = node.args
            if source not in self.multi:
                self.unsupported.append(("getitem", _source(node, self.where)))
            self.names[node] = f"{self.names.get(source, source.name)}_{index}"
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            self.call(node)
        elif node.op == "output":
            returned = self.returned if self.returned is not None else node.args[0]
            if isinstance(returned, torch.fx.Node):  # a split segment's single result
                returned = [returned]
            self.outputs = [self.stored_output(a) if isinstance(a, torch.fx.Node) else None
                            for a in returned]
        else:
            self.unsupported.append((str(node.target), _source(node, self.where)))


def to_ir(gm, name, where="", returned=None, logical=()):
    """Translates an FX graph of aten ops into the compiler's IR text.

    Returns (text, inputs, outputs, unsupported, back). The IR is canonical: its
    inputs and returned values are sorted by name, because AOTAutograd's
    partitioner orders saved activations by Python's (per-process) hashing,
    and the compile cache key must be the same in every process and rank.
    `inputs` lists, in IR input order, (the FX placeholder's position,
    None or the order to permute it to: an input traced with a permuted
    dense layout is read as stored, see _Translation.placeholder), or
    (None, None) for the dropout seed, an input that is no placeholder;
    `outputs` maps the FX output list to IR value names (None where the
    graph returns None); `unsupported` lists (op, source) of nodes the IR
    cannot express (then text is None). `returned`, when given, replaces
    the output node's list (_view_outputs). A returned value traced with
    a permuted dense layout is returned in memory order, `outputs` naming
    it NAME_stored, unless it is in `logical` (_Translation.stored_output);
    `back` maps such names to the dims that permute it back."""
    t = _Translation(where, returned, (n.name for n in gm.graph.nodes), logical)
    for node in gm.graph.nodes:
        t.node(node)
    if t.unsupported:
        return None, None, t.outputs, t.unsupported, {}
    inputs = t.inputs
    sorted_inputs = sorted(range(len(inputs)), key=lambda i: inputs[i][0])
    order = [(i, t.stored[i]) if inputs[i][0] != _SEED else (None, None)
             for i in sorted_inputs]
    returned = sorted({o for o in t.outputs if o is not None})
    text = (f"graph {name}({', '.join(inputs[i][1] for i in sorted_inputs)}) {{\n" +
            "\n".join(t.lines) + f"\n  return {', '.join('%' + o for o in returned)}\n}}\n")
    return text, order, t.outputs, [], t.back


def _record(entry, gm, settings, text=None, graph=None):
    """Adds `entry` to metrics() with the graph's input signature and the
    settings it was compiled with, and writes its artifacts when asked
    (compile_record)."""
    entry["inputs"] = _compile_record.input_signature(gm)
    entry.update(settings or _compile_record.DEFAULT_SETTINGS)
    with _lock:
        _metrics.append(entry)
    row = _row(entry)
    if graph is not None:
        row.update(graph.info())
    _compile_record.write_artifacts(entry, row, gm, text, graph)


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


def _drop_unused_random_ops(gm):
    """Removes random ops whose results nothing uses. AOTAutograd's backward
    graph can carry such a recomputation of a forward dropout (its mask is
    saved from the forward), and FX keeps it because random ops count as
    impure; run, it would only draw numbers and waste device time."""
    def impure(node):
        if (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                and torch.Tag.nondeterministic_seeded in node.target.tags):
            return False
        return node.is_impure()
    if gm.graph.eliminate_dead_code(is_impure_node=impure):
        gm.recompile()


# Views whose result is its input's bytes, contiguous as they are: an
# output made by a chain of them from an input or another value is made
# from that tensor in Python (a view, as eager's), not stored by the graph.
_SAME_BYTES = frozenset({"aten.view", "aten._unsafe_view", "aten.alias", "aten.detach",
                         "aten.expand", "aten.squeeze", "aten.squeeze.dim",
                         "aten.squeeze.dims", "aten.unsqueeze"})


# Views that reorder their input's dims: an output made by a chain of
# them and same-bytes views from an input is that input's view in Python
# too (a saved weight's t(), as eager saves it); the next graph reads it as
# its bytes lie (_Translation.placeholder).
_LAYOUT = frozenset({"aten.t", "aten.permute", "aten.transpose.int"})


def _view_of_first_arg(node, ops):
    """Whether `node` is one of the view ops `ops` of its first argument,
    its other arguments constants."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and _op_name(node.target) in ops and bool(node.args)
            and isinstance(node.args[0], torch.fx.Node)
            and not any(isinstance(a, torch.fx.Node) for a in node.args[1:])
            and not any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()))


def _same_bytes_view(node):
    """Whether `node` is a view of its first argument's bytes, in order."""
    if not _view_of_first_arg(node, _SAME_BYTES):
        return False
    if _op_name(node.target) == "aten.expand":  # only to the same shape
        source, meta = node.args[0].meta.get("tensor_meta"), node.meta.get("tensor_meta")
        return source is not None and meta is not None and source.shape == meta.shape
    return True


def _view_outputs(gm):
    """The graph's outputs with each chain of same-bytes views taken back
    to its base: (returned, derived). `returned` is the output list for the
    IR, None where an output is derived: from an input through same-bytes
    and layout views (the graph does not return it), or through same-bytes
    views from the one output the graph returns for a computed
    base (the base itself when returned, else the first of its views, whose
    shape its store keeps). `derived`
    maps an output's index to ("input", placeholder, views to replay on it,
    base first) or ("output", index, shape). Derived outputs are not copies:
    they share their base's memory, as in eager."""
    returned = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    if isinstance(returned, torch.fx.Node):
        return None, {}
    out, derived = list(returned), {}
    kept = {n: k for k, n in reversed(list(enumerate(returned)))  # bases returned as they are
            if isinstance(n, torch.fx.Node) and n.op != "placeholder"
            and not _same_bytes_view(n)}
    for k, node in enumerate(returned):
        if not isinstance(node, torch.fx.Node):
            continue
        views, base = [], node
        while _same_bytes_view(base) or _view_of_first_arg(base, _LAYOUT):
            views.append(base)
            base = base.args[0]
        if base.op == "placeholder":
            derived[k], out[k] = ("input", base, views[::-1]), None
            continue
        views, base = [], node
        while _same_bytes_view(base):
            views.append(base)
            base = base.args[0]
        if (views and node.meta.get("tensor_meta") is not None
              and kept.setdefault(base, k) != k):
            derived[k] = ("output", kept[base], tuple(node.meta["tensor_meta"].shape))
            out[k] = None
    if all(o is None for o in out):  # the graph would return nothing
        return None, {}
    return out, derived


def _input_view(base, views):
    """A function making the output that is input `base` (a placeholder)
    through the view nodes `views`: one as_strided with the traced result's
    sizes and strides, of the input when it has its traced strides, else of
    a copy of it laid out as traced (so every view the trace made applies).
    Without traced strides, or through a detach (whose result autograd
    sees apart from its base), the views are replayed (_replay)."""
    meta = [n.meta.get("tensor_meta") for n in [base] + list(views)]
    if (not views or any(m is None or getattr(m, "stride", None) is None for m in meta)
            or any(_op_name(v.target) == "aten.detach" for v in views)):
        return lambda tensor: _replay(tensor, views)
    traced = tuple(meta[0].stride)
    size, stride = tuple(meta[-1].shape), tuple(meta[-1].stride)

    def make(tensor):
        if tensor.stride() != traced:
            tensor = torch.empty_strided(tensor.shape, traced, dtype=tensor.dtype,
                                         device=tensor.device).copy_(tensor)
        return tensor.as_strided(size, stride, tensor.storage_offset())
    return make


def _replay(base, views):
    """`base` through the view nodes `views` (their other arguments as
    recorded). A base that is not contiguous (a caller's strided input, of
    a shape the graph was compiled for) is copied first, as the graph would
    have read it, so a view never fails on strides the trace did not see."""
    if views and not base.is_contiguous():
        base = base.contiguous()
    for v in views:
        base = v.target(base, *v.args[1:], **v.kwargs)
    return base


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
    text, order, outputs, unsupported, back = to_ir(gm, name, where, returned, logical)
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
             "compiled_here": info["cache"] == "compiled", "text": text}
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
    "artifacts", the directory of its files, under NEURON_COMPILE_ARTIFACTS."""
    out = []
    with _lock:
        entries = list(_metrics)
    for e in entries:
        row = _row(e)
        if e.get("graph") is not None:
            row.update(e["graph"].info())
        out.append(row)
    return out


def _row(entry):
    return {k: v for k, v in entry.items() if k not in ("graph", "text")}


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
