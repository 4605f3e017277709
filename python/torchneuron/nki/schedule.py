"""The engines' timelines of one kernel run: a list scheduler.

Each instruction goes to one engine. It may start once its inputs are ready
(the end of the instruction that last wrote each tile it reads) and, for
the tiles it writes, once their previous writer and readers are done; it
takes the device model's time for it (runtime CostModel through
torchneuron._C), and is placed in the earliest window of its engine from
then on that is long enough:

    start = the first free window of the engine at or after
            max(inputs ready, outputs free)
    end   = start + modelled time

so an instruction issued later whose inputs are ready early fills a gap an
earlier one left, as NKI's compiler schedules the independent iterations of
affine_range loops; the engines then run them in that order. The tensor,
vector, scalar and gpsimd engines each run one instruction at a time. DMA
transfers share the DMA engines' bandwidth the same way (the 16 queues do
not wait for each other), while each transfer's fixed latency overlaps the
others' (as in the compiler's TimePlan). An elementwise instruction that
starts when an input becomes ready (rather than when its engine frees) pays
the engine's dependent overhead (CostModel::Elementwise's `dependent`).
"""

import bisect
import dataclasses

from .. import _C

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclasses.dataclass
class Instruction:
    """One priced instruction: what, where, when (us on the kernel's clock)
    and the kernel line that issued it (filename, lineno)."""
    name: str
    engine: str
    start_us: float
    end_us: float
    line: tuple

    @property
    def duration_us(self):
        return self.end_us - self.start_us


class Schedule:
    """The per-engine timelines of one run (not thread-safe: one kernel
    run on one thread)."""

    def __init__(self):
        # Each engine's busy windows: starts and ends, sorted, not overlapping.
        self.starts = {e: [] for e in ENGINES}
        self.ends = {e: [] for e in ENGINES}
        self.instructions = []

    @staticmethod
    def ready(reads, writes):
        """When an instruction reading `reads` and writing `writes`
        (allocations) may start, engine aside."""
        t = 0.0
        for a in reads:
            t = max(t, a.ready_us)
        for a in writes:
            t = max(t, a.ready_us, a.read_until_us)
        return t

    def issue(self, name, engine, cost, reads, writes, line):
        """Schedules one instruction on `engine`; `cost(dependent)` is its
        modelled time in us. Returns its end."""
        deps = self.ready(reads, writes)
        waited = cost(deps > 0)
        start = self._first_window(engine, deps, waited)
        duration = waited if start == deps and deps > 0 else cost(False)
        self._book(engine, start, duration)
        end = start + duration
        self._finish(reads, writes, end)
        self.instructions.append(Instruction(name, engine, start, end, line))
        return end

    def issue_dma(self, name, nbytes, partitions, reads, writes, line):
        """Schedules one DMA: its bytes move in the DMA bandwidth's first
        free window after its inputs, its latency overlaps."""
        total, latency = _C._nki_dma_us(int(nbytes), max(1, int(partitions)))
        moving = self._first_window("dma", self.ready(reads, writes), total - latency)
        self._book("dma", moving, total - latency)
        end = moving + total
        self._finish(reads, writes, end)
        self.instructions.append(Instruction(name, "dma", moving, end, line))
        return end

    def _first_window(self, engine, earliest, length):
        """The start of the first free window of `length` at or after
        `earliest` on `engine`."""
        starts, ends = self.starts[engine], self.ends[engine]
        start = earliest
        for i in range(bisect.bisect_right(ends, earliest), len(starts)):
            if start + length <= starts[i]:
                break
            start = max(start, ends[i])
        return start

    def _book(self, engine, start, length):
        index = bisect.bisect_right(self.starts[engine], start)
        self.starts[engine].insert(index, start)
        self.ends[engine].insert(index, start + length)

    @staticmethod
    def _finish(reads, writes, end):
        for a in reads:
            a.read_until_us = max(a.read_until_us, end)
        for a in writes:
            a.ready_us = end

    def time_us(self):
        """The kernel's modelled time: the last instruction's end."""
        return max((i.end_us for i in self.instructions), default=0.0)

    def timelines(self):
        """{engine: [Instruction, ...]} in start order, busy engines only."""
        out = {}
        for i in self.instructions:
            out.setdefault(i.engine, []).append(i)
        for lst in out.values():
            lst.sort(key=lambda i: i.start_us)
        return out

    def busy_us(self):
        """{engine: the sum of its instructions' durations}."""
        out = {}
        for i in self.instructions:
            out[i.engine] = out.get(i.engine, 0.0) + i.duration_us
        return out
