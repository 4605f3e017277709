"""What torchneuron.compiler.metrics() records of each compiled graph
besides its figures: its input signature and the settings it was compiled
with (the effective mode, options and fullgraph); and, when
NEURON_COMPILE_ARTIFACTS is set, its artifacts on disk, as TorchNeuron's
artifact controls keep them (docs/compiler.md, "Artifacts"):

    <dir>/<graph name>-<graph id, 16 hex>/
        fx_graph.txt     the aten FX graph AOTAutograd handed over
        ir.txt           the compiler's IR text made from it
        plan.textproto   the executable (constants' bytes as their count)
        record.json      the graph's metrics() row

<dir> is <compile cache>/artifacts for NEURON_COMPILE_ARTIFACTS=1, else the
variable's value. Graphs that run on the CPU have fx_graph.txt and
record.json only.
"""

import json
import os

from . import _C
from .files import write_atomically

# What a graph compiled outside torch.compile's settings (none given) gets.
DEFAULT_SETTINGS = {"mode": "default", "options": {"fallback": True}, "fullgraph": False}


def settings(mode, options, fullgraph, known):
    """The effective settings of a torch.compile call: the mode compiled
    (always "default"; `requested_mode` when another was asked for), the
    known options with their defaults filled in, `ignored_options` (unknown
    keys, warned about), and fullgraph."""
    out = {"mode": "default", "options": {"fallback": options.get("fallback", True) is not False},
           "fullgraph": bool(fullgraph)}
    if mode not in (None, "default"):
        out["requested_mode"] = mode
    ignored = sorted(set(options) - set(known))
    if ignored:
        out["ignored_options"] = ignored
    return out


def _describe(value):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return repr(value)
    return f"{str(dtype).replace('torch.', '')}{list(int(d) for d in shape)}"


def input_signature(gm):
    """Each input of the FX graph `gm` as "dtype[d0, d1, ...]", in order
    (from the placeholders' traced values)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val", node.meta.get("tensor_meta"))
        out.append(_describe(value) if value is not None else node.name)
    return out


def metrics_row(entry):
    """The metrics() row of a graph's entry: its fields but the compiled
    graph and IR text, with the compiled graph's figures (info())."""
    row = {k: v for k, v in entry.items() if k not in ("graph", "text")}
    if entry.get("graph") is not None:
        row.update(entry["graph"].info())
    return row


def write_artifacts(entry, gm, text=None, graph=None):
    """Writes the artifacts of the graph `entry` (compiled to `graph`, None
    for one that runs on the CPU) when NEURON_COMPILE_ARTIFACTS asks for
    them; returns their directory or None."""
    base = _C._compile_artifacts_dir()
    if not base:
        return None
    row = metrics_row(entry)
    tag = (row.get("graph_id") or "cpu")[:16]
    path = os.path.join(base, f"{row['name']}-{tag}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    write_atomically(os.path.join(path, "fx_graph.txt"), gm.print_readable(print_output=False))
    if text is not None:
        write_atomically(os.path.join(path, "ir.txt"), text)
    if graph is not None:
        write_atomically(os.path.join(path, "plan.textproto"), graph.plan_text())
    write_atomically(os.path.join(path, "record.json"),
                     json.dumps(row, indent=1, sort_keys=True, default=str))
    entry["artifacts"] = path
    return path
