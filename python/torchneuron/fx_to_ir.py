"""An aten FX graph, as AOTAutograd hands it over, as the compiler's IR
text (to_ir): types, attributes, operands, results and their stored
layouts, canonical so the compile cache key is the same in every process."""

import operator

import torch

from . import _C
from .fx_ops import (_LAYOUT, _RANDOM, _graph_kernels, _kernel_of, _op_name, _source,
                     _view_of_first_arg)


# torch dtype -> the IR's name, from the project's one dtype list.
_DTYPES = {getattr(torch, name): ir for name, ir, _on_device in _C._dtypes()}


class _Unsupported(Exception):
    pass


# The input a graph with dropout gets: each run's seed, drawn from torch's
# default generator (torch.manual_seed makes compiled dropout reproducible).
_SEED = "dropout_seed"


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
        self.kernels = []  # each kernel operator's summary (graph_kernel.ir_call)

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

    def kernel_call(self, node):
        """A kernel operator's node (nki.as_op) as one nki.kernel IR line,
        priced by the kernel's own schedule (nki/graph_kernel.py)."""
        try:
            args, attrs, summary = _graph_kernels().ir_call(node)
            out, several = _results(node, "nki.kernel", node.meta.get("tensor_meta"))
        except _Unsupported:
            self.unsupported.append((_op_name(node.target), _source(node, self.where)))
            return
        if several:
            self.multi.add(node)
        self.kernels.append(summary)
        self.lines.append(f"  {out} = nki.kernel({', '.join('%' + self.names[a] for a in args)})"
                          f" {{{', '.join(attrs)}}}  # {_source(node, self.where)}")
        self.names[node] = node.name

    def call(self, node):
        """An aten op node as one IR line."""
        if _kernel_of(node.target) is not None:
            return self.kernel_call(node)
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


def to_ir(gm, name, where="", returned=None, logical=(), kernels=None):
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
    `back` maps such names to the dims that permute it back. `kernels`,
    when given, receives each kernel operator's summary (its op, kernel,
    key, modelled time_us, busy_us per engine, hbm_bytes)."""
    t = _Translation(where, returned, (n.name for n in gm.graph.nodes), logical)
    for node in gm.graph.nodes:
        t.node(node)
    if kernels is not None:
        kernels.extend(t.kernels)
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
