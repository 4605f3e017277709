"""The operations that left the "neuron" device: CPU fallbacks with their
source lines (``torch.neuron.fallback_report``).

A real NeuronCore runs an operator it has no kernel for on the host: the
inputs go to the CPU, the CPU kernel runs, the results come back, and the
device waits (docs/operators.md, "CPU fallback"). The device model prices
each such run so; a report says, for a region::

    with torch.neuron.fallback_report() as report:
        loss = model(x).sum()
        loss.backward()
    print(report)          # one row per (operator, source line), costliest first
    report.rows[0]         # FallbackRow(op, count, modelled_us, share, file, line)

each operator of kind "fallback" run in it (torchneuron.fabric.eager_records),
how many times, its modelled cost, its share of the modelled compute time
of the region (the device model's charges to the rank's compute clock:
eager operations, compiled graphs, advance_compute), and the user's
source line: the innermost frame of the Python stack, when the operator was
dispatched, outside torch's and torchneuron's packages. A compiled graph's
CPU segments run their operators eagerly: they are listed too.

``NEURON_FALLBACK_REPORT=1`` (docs/configuration.md) records a process's
whole run from ``import torchneuron`` and prints the report to stderr at
exit; under neuronrun each rank's lines come out as ``[rank N]: ...``.

Cost: the Python stack is walked only while a report records (a flag the
C++ fallback path reads); with no report recording an eager operator pays
one atomic load.
"""

import atexit
import collections
import contextlib
import os
import sys

import torch

from . import _C

FallbackRow = collections.namedtuple(
    "FallbackRow", ["op", "count", "modelled_us", "share", "file", "line"])
FallbackRow.__doc__ = """One operator run on the host from one source line: its
ATen name, how many runs, their modelled cost in microseconds, that cost's
share of the region's modelled compute time (0 to 1), and the file and line
("<no Python frame>", 0 for a thread without Python)."""


def _internal_prefixes():
    """The directories whose frames are not the user's: torch's and
    torchneuron's packages (as imported and resolved), and torch.fx's
    generated code."""
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(__file__)}
    dirs |= {os.path.realpath(d) for d in dirs}
    return sorted(d + os.sep for d in dirs) + ["<eval_with_key>"]


def _snapshot():
    return {(op, file, line): (count, us) for op, file, line, count, us in
            _C._fallback_report_rows()}


class FallbackReport:
    """A region's CPU fallbacks (filled in when the region ends).

    ``rows``: FallbackRows, costliest first; ``step_us``: the region's
    modelled compute time; ``fallback_us``: the rows' total cost."""

    def __init__(self):
        self.rows = []
        self.step_us = 0.0
        self._recording = False

    @property
    def fallback_us(self):
        return sum(r.modelled_us for r in self.rows)

    def _start(self):
        self._base = _snapshot()
        self._base_us = _C._clock()["charged_us"]
        _C._fallback_report_start(_internal_prefixes())
        self._recording = True

    def _stop(self):
        if not self._recording:
            return
        _C._fallback_report_stop()
        self._recording = False
        self.step_us = max(_C._clock()["charged_us"] - self._base_us, 0.0)
        rows = []
        for (op, file, line), (count, us) in _snapshot().items():
            base_count, base_us = self._base.get((op, file, line), (0, 0.0))
            if count > base_count:
                rows.append((op, count - base_count, us - base_us, file, line))
        step = max(self.step_us, sum(r[2] for r in rows))  # a clock reset inside
        self.rows = sorted(
            (FallbackRow(op, n, us, us / step if step > 0 else 0.0, file, line)
             for op, n, us, file, line in rows),
            key=lambda r: (-r.modelled_us, r.op, r.file, r.line))

    def table(self):
        """The report as text: a header line, then one line per row."""
        head = (f"neuron fallback report: {len(self.rows)} CPU fallback site(s), "
                f"{self.fallback_us:.1f} us of {self.step_us:.1f} us modelled compute "
                f"({self._share(self.fallback_us):.1%})")
        lines = [head]
        if self.rows:
            lines.append(f"{'op':<36} {'count':>7} {'modelled_us':>12} {'share':>7}  source")
        for r in self.rows:
            lines.append(f"{r.op:<36} {r.count:>7} {r.modelled_us:>12.1f} {r.share:>7.1%}  "
                         f"{r.file}:{r.line}")
        return "\n".join(lines)

    def _share(self, us):
        return us / self.step_us if self.step_us > 0 else 0.0

    def __str__(self):
        return self.table()

    def __repr__(self):
        return f"<FallbackReport {len(self.rows)} rows, {self.fallback_us:.1f} us>"


@contextlib.contextmanager
def fallback_report():
    """Records the CPU fallbacks run on "neuron" in the ``with`` block; yields
    a FallbackReport whose rows are filled in when the block ends. Regions
    nest; each sees every fallback run inside it."""
    report = FallbackReport()
    report._start()
    try:
        yield report
    finally:
        report._stop()


_run_report = None


def _print_run_report():
    _run_report._stop()
    print(_run_report.table(), file=sys.stderr, flush=True)


def _install_from_environment():
    """NEURON_FALLBACK_REPORT=1: records the whole run and prints its report
    to stderr at exit."""
    global _run_report
    if _run_report is not None or not _C._fallback_report_requested():
        return
    _run_report = FallbackReport()
    _run_report._start()
    atexit.register(_print_run_report)
