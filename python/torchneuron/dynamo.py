"""torch.compile(backend="neuron"): TorchDynamo's graphs on the simulated
NeuronCore.

    model = torch.compile(model, backend="neuron")
    loss = model(x).sum(); loss.backward()   # forward and backward compiled

TorchDynamo captures the Python code it can (a graph break runs the rest
eagerly, as everywhere in torch.compile); AOTAutograd splits each captured
graph into forward and backward aten graphs, and each of those goes through
the compiler path (torchneuron.compiler): translation to
the compiler's IR, the compile cache, the executor (real results and the
modelled NeuronCore time, in torchneuron.compiler.metrics()). Operators the
device does not run run as CPU segments of their graph, reported and warned
about; with fullgraph=True that is an error naming the operator and its
source line, as a graph break is Dynamo's error.

The package's torch_dynamo_backends entry point registers the backend under
"neuron": TorchDynamo loads this module when a torch.compile call first
names it, so importing torch (or torchneuron) does not import TorchDynamo.

Arguments of torch.compile:
- mode: only the default; another mode warns and compiles as the default.
- options: OPTIONS below; an unknown option warns and is ignored.
- dynamic: shapes are static on the device. Where Dynamo hands over a graph
  with symbolic sizes (dynamic=True, or a dimension it saw change), each
  concrete shape the graph is called with compiles (or fetches from the
  compile cache) executables of its own; dynamic=True warns once.
"""

import copy
import itertools
import math
import re
import threading
import warnings

import torch

from . import compile_record as _compile_record
from . import compiler as _compiler

# The backend's documented options (torch.compile(..., options={...})).
OPTIONS = {
    "fallback": "False: an operator the device does not run is an error, as with "
                "fullgraph=True (default True: it runs on the CPU, reported)",
}

_counter = itertools.count(1)
_warned = set()
_lock = threading.Lock()


def _warn_once(key, message):
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, stacklevel=3)


def _fullgraph():
    """Whether the running torch.compile call has fullgraph=True (Dynamo's
    translator for the frame being compiled says so)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        return bool(InstructionTranslator.current_tx().one_graph)
    except (ImportError, AttributeError, AssertionError, RuntimeError):
        return False


def _label(gm):
    """What the captured frame runs, as an IR name: the class name of the
    module whose forward it is ("GPT"; Dynamo's frame, or the graph's
    outermost nn_module_stack entry), else the function's name ("_lambda_");
    "graph" when nothing says."""
    label = None
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
        owner = tx.f_locals.get("self", tx.f_locals.get("fn"))
        if isinstance(owner, torch.nn.Module):
            label = type(owner).__name__
        elif tx.f_code.co_name != "inner":
            label = tx.f_code.co_name
    except (ImportError, AttributeError, AssertionError, RuntimeError):
        pass
    for node in gm.graph.nodes if label is None else ():
        stack = node.meta.get("nn_module_stack")
        if stack:
            _path, kind = next(iter(stack.values()))
            label = getattr(kind, "__name__", str(kind))
            break
    return re.sub(r"\W", "_", label or "graph")


def _symbolic(example_inputs):
    """Whether Dynamo handed over symbolic sizes (dynamic shapes)."""
    for x in example_inputs:
        if isinstance(x, torch.SymInt):
            return True
        if isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape):
            return True
    return False


def _where(gm):
    """The user's source line of the captured graph's first operation."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            found = _compiler._stack_line(node)
            if found:
                return found
    return ""


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """scaled_dot_product_attention as the device's operators (batched
    matmuls, a float comparison for the causal mask, masked_fill, softmax)
    in place of PyTorch's fused CPU kernel: upstream's math reference, so its
    results agree with eager's within rounding, a row that attends nowhere
    (fully masked) included: it is 0, as eager's safe softmax makes it. A
    mask's boolean work (inverting a bool mask, finding rows that attend
    nowhere) runs on the CPU: the device has no boolean operators."""
    if enable_gqa:  # groups of query heads share a key/value head
        group = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(group, dim=-3)
        value = value.repeat_interleave(group, dim=-3)
    factor = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    weights = (query @ key.transpose(-2, -1)) * factor
    if is_causal:  # position i attends to 0..i (upstream's tril, top-left aligned)
        # float32 positions: exact to 2^24 (bfloat16's only to 256)
        rows = torch.arange(query.size(-2), dtype=torch.float32, device=weights.device)
        cols = torch.arange(key.size(-2), dtype=torch.float32, device=weights.device)
        weights = weights.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
    empty = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            masked = ~attn_mask
            weights = weights.masked_fill(masked, float("-inf"))
        else:
            masked = attn_mask == float("-inf")
            weights = weights + attn_mask
        empty = masked.all(dim=-1, keepdim=True)  # rows that attend nowhere
        weights = weights.masked_fill(empty, 0.0)  # finite, so their gradient is 0
    weights = weights.softmax(dim=-1)
    if empty is not None:
        weights = weights.masked_fill(empty, 0.0)
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, dropout_p, training=True)
    return weights @ value


def _device_operators(gm):
    """Rewrites the Dynamo graph's calls to PyTorch's fused kernels that the
    device runs as other operators (today: attention)."""
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._nn.scaled_dot_product_attention:
            node.target = _attention
            changed = True
    if changed:
        gm.recompile()
    return gm


def _aot(gm, example_inputs, name, strict, where, settings):
    """Compiles `gm` through AOTAutograd: its forward, backward and inference
    graphs each through torchneuron.compiler (`settings`: what metrics()
    records they were compiled with)."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind):
        def compile_graph(graph, inputs):
            return _compiler._compile_fx(graph, inputs, f"{name}_{kind}", strict, where,
                                         settings)
        return compile_graph
    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                        inference_compiler=compiler("inference"))(_device_operators(gm),
                                                                  example_inputs)


def _specialised(gm, args):
    """A copy of `gm` with its size inputs (the ints among `args`) made
    constants: it takes the tensors only."""
    gm = copy.deepcopy(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, args):
        if isinstance(value, torch.Tensor):
            continue
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs,
                                                lambda a, n=node, v=value: v if a is n else a)
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


class _PerShape:
    """A graph with symbolic sizes, run as one static-shape compilation per
    concrete input shape (the device's executables have static shapes)."""

    def __init__(self, gm, name, strict, where, settings):
        self.gm, self.name, self.strict, self.where = gm, name, strict, where
        self.settings = settings
        self.compiled = {}

    def __call__(self, *args):
        key = _compiler._signature(args, {})  # shapes and dtypes; sizes by value
        fn = self.compiled.get(key)
        if fn is None:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            fn = _aot(_specialised(self.gm, args), tensors,
                      f"{self.name}_s{len(self.compiled)}", self.strict, self.where,
                      self.settings)
            self.compiled[key] = fn
        return fn(*[a for a in args if isinstance(a, torch.Tensor)])


def neuron_backend(gm, example_inputs, mode=None, options=None):
    """The "neuron" backend of torch.compile (see the module's text)."""
    if mode not in (None, "default"):
        _warn_once(("mode", mode), f'torch.compile(backend="neuron"): mode={mode!r} is not '
                   "supported; compiling with the default mode")
    options = dict(options or {})
    for key in sorted(set(options) - set(OPTIONS)):
        _warn_once(("option", key), f'torch.compile(backend="neuron"): unknown option '
                   f"{key!r} ignored (known: {', '.join(sorted(OPTIONS))})")
    # Strict: an operator the device does not run is an error saying why.
    strict = ("fullgraph=True" if _fullgraph()
              else "options fallback=False" if options.get("fallback", True) is False
              else False)
    name = f"{_label(gm)}_{next(_counter)}"
    where = _where(gm)
    settings = _compile_record.settings(mode, options, _fullgraph(), OPTIONS)
    if _symbolic(example_inputs):
        _warn_once("dynamic", 'torch.compile(backend="neuron"): shapes are static on the '
                   "device; each input shape compiles executables of its own")
        return _PerShape(gm, name, strict, where, settings)
    return _aot(gm, example_inputs, name, strict, where, settings)

