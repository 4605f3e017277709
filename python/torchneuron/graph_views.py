"""Outputs of a compiled graph that are views: made in Python from an input
or another output (as eager makes them), not stored by the graph; and
random ops nothing uses, dropped before compiling."""

import torch

from .fx_ops import _LAYOUT, _op_name, _same_bytes_view, _view_of_first_arg


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
