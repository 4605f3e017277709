"""Kernels: Python functions over tiles, run for real and priced.

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    def add_reference(a, b):
        return a + b

    @nki.jit(reference=add_reference)
    def add_kernel(a, b):                       # a, b: HBM tensors (128, F)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), nl.load(b)))
        return out

    y = add_kernel(x1, x2)                      # torch tensors in, torch tensors out
    run = add_kernel.run(x1, x2)                # + run.time_us, run.timelines(), ...

Calling a kernel runs its body once on the CPU: every language call
computes its tile's values with torch and issues one instruction to the
engines' list scheduler (schedule.py), checked against the device's rules
(errors.py). The outputs are the kernel's results. When any argument lives
on "neuron", the outputs are "neuron" tensors and the run is charged to the
rank's simulated compute clock as one eager operation ("nki::<name>", kind
"nki", in torchneuron.fabric.eager_records()) of the kernel's modelled time.
One kernel runs at a time per process (the language's state is global).
"""

import dataclasses
import time

import torch

from .. import _C
from .errors import fail
from .schedule import Schedule
from .tiles import HbmTensor, Memory

_spec = None
_current = None  # the Run in progress


def spec():
    """The device's on-chip figures (torchneuron._C._nki_spec()), read once."""
    global _spec
    if _spec is None:
        _spec = dict(_C._nki_spec())
    return _spec


class Run:
    """The state of one kernel run: its schedule, its memory, the HBM bytes
    it moved."""

    def __init__(self, name):
        self.name = name
        self.schedule = Schedule()
        self.memory = Memory(spec())
        self.hbm_bytes = 0


def current():
    """The run in progress; language calls outside a kernel are an error."""
    if _current is None:
        fail("a kernel language call outside a kernel (call it from an @nki.jit "
             "function)", kernel_name="<none>")
    return _current


def current_name():
    return _current.name if _current is not None else "<none>"


@dataclasses.dataclass
class KernelRun:
    """One run's results and figures: outputs (torch tensors), time_us
    (modelled), wall_us, instructions (schedule.Instruction), and peak
    bytes per partition held in SBUF and PSUM."""
    name: str
    outputs: object
    time_us: float
    wall_us: float
    hbm_bytes: int
    instructions: list
    peak_sbuf_bytes: int
    peak_psum_bytes: int
    schedule: Schedule

    def timelines(self):
        """{engine: [Instruction, ...]} in start order."""
        return self.schedule.timelines()

    def busy_us(self):
        """{engine: busy microseconds}."""
        return self.schedule.busy_us()

    def export_chrome_trace(self, path):
        """Writes the run's engine timelines to `path` (chrome://tracing,
        Perfetto): one track per engine, each instruction an event on the
        kernel's clock (us from its start) with its kernel line."""
        import json
        import os
        events = [{"name": i.name, "ph": "X", "pid": f"nki {self.name}", "tid": i.engine,
                   "ts": i.start_us, "dur": i.duration_us,
                   "args": {"line": f"{os.path.basename(i.line[0])}:{i.line[1]}"}}
                  for i in self.instructions]
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"traceEvents": events}, f)


class Kernel:
    """A kernel function with its reference (a torch implementation of the
    same function, for nki.check and for fake tensors in compiled graphs)."""

    def __init__(self, fn, reference=None, name=None):
        self.fn = fn
        self.reference = reference
        self.name = name or fn.__name__

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs).outputs

    def run(self, *args, **kwargs):
        """Runs the kernel; returns its KernelRun."""
        global _current
        if _current is not None:
            fail(f"kernel {self.name} called inside kernel {_current.name}: kernels do "
                 f"not nest")
        device = _device_of(args)
        hbm_args = [_to_hbm(a, i) for i, a in enumerate(args)]
        run = Run(self.name)
        _current = run
        start = time.perf_counter()
        try:
            result = self.fn(*hbm_args, **kwargs)
            outputs = _outputs(result, device, self.name)
        finally:
            _current = None
        wall_us = (time.perf_counter() - start) * 1e6
        time_us = run.schedule.time_us()
        if device.type != "cpu":
            _C._nki_charge(self.name, time_us, wall_us, run.hbm_bytes, device.index or 0)
        return KernelRun(self.name, outputs, time_us, wall_us, run.hbm_bytes,
                         run.schedule.instructions, run.memory.peak["sbuf"],
                         run.memory.peak["psum"], run.schedule)


def jit(fn=None, *, reference=None, name=None):
    """Decorator: makes `fn` a Kernel (see the module's docstring)."""
    if fn is None:
        return lambda f: Kernel(f, reference=reference, name=name)
    return Kernel(fn, reference=reference, name=name)


def _device_of(args):
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
            return a.device
    return torch.device("cpu")


def _to_hbm(arg, position):
    if isinstance(arg, torch.Tensor):
        return HbmTensor(_C._nki_host_view(arg.detach()), f"argument {position}")
    return arg


def _outputs(result, device, name):
    """The kernel's returned HBM tensors as torch tensors on `device`."""
    single = not isinstance(result, (tuple, list))
    items = [result] if single else list(result)
    outs = []
    for r in items:
        if not isinstance(r, HbmTensor):
            fail(f"kernel {name} returned {type(r).__name__}: a kernel returns the HBM "
                 f"tensors it made with nl.ndarray(..., buffer=nl.shared_hbm)")
        if device.type == "cpu":
            outs.append(r.data)
        else:
            out = torch.empty(r.shape, dtype=r.dtype, device=device)
            _C._nki_host_view(out).copy_(r.data)
            outs.append(out)
    return outs[0] if single else tuple(outs)
