"""A training run's figures as `neuronrun matrix` reads them: a RunFigures
text proto (launcher/proto/neuron/launcher/matrix_result.proto), written by
rank 0 of the matrix's trainers (examples/04_train_gpt.py,
examples/08_upstream_gpt.py, examples/09_moe_gpt.py).

    figures = {"world": 4, "loss": 4.2, "modelled_step_us": median(steps), ...}
    run_figures.write(path, figures, collective_bytes(groups, len(steps)))
"""
import json

from . import fabric
from .files import write_atomically


def median(values):
    """The middle value (the upper one of an even count); 0 for none."""
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def collective_bytes(groups, steps):
    """Bytes per step by collective op over this rank's neuron groups (a
    group of another backend is skipped)."""
    out = {}
    for group in groups:
        try:
            records = fabric.records(group)
        except TypeError:  # not a neuron group
            continue
        for r in records:
            out[r["op"]] = out.get(r["op"], 0) + r["bytes"] / steps
    return out


def device_compute_us(device):
    """The device model's compute on this rank so far: its eager operations
    and every run of its compiled graphs (0 off the "neuron" device)."""
    if device.type != "neuron":
        return 0.0
    from . import compiler
    graphs = sum(e["modelled_us"] * e.get("runs", 0) for e in compiler.metrics()
                 if "modelled_us" in e)
    return fabric.eager_totals()["modelled_us"] + graphs


def model_state_mib(parameters, optimizer):
    """This rank's share of the model state in MiB: its parameters (their
    local shards, for DTensors), their gradients and `optimizer`'s state."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t
    tensors = list(parameters)
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += [v for state in optimizer.state.values() for v in state.values()
                if hasattr(v, "numel")]
    return sum(local(t).numel() * t.element_size() for t in tensors) / 2**20


def write(path, figures, bytes_per_step, peak_allocated_mib_by_phase=None):
    """Writes `figures` (RunFigures' field names to numbers), the bytes per
    step by collective op and the peak allocated MiB by memory phase as a
    RunFigures text proto."""
    lines = [f"{key}: {value!r}" for key, value in figures.items()]
    lines += [f"bytes_per_step {{ key: {json.dumps(op)} value: {float(n)!r} }}"
              for op, n in sorted(bytes_per_step.items())]
    lines += [f"peak_allocated_mib_by_phase {{ key: {json.dumps(phase)} value: {float(mib)!r} }}"
              for phase, mib in (peak_allocated_mib_by_phase or {}).items()]
    write_atomically(path, "\n".join(lines) + "\n")
