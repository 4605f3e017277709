"""The engines' timelines of one kernel run: a list scheduler.

Each instruction goes to one engine in program order. It starts when its
engine is free and its inputs are ready (the end of the instruction that
last wrote each tile it reads), and, for the tiles it writes, when the
previous writer and readers of those tiles are done; it ends after the
device model's time for it (runtime CostModel through torchneuron._C):

    start = max(engine free, inputs ready, outputs free)
    end   = start + modelled time

The tensor, vector, scalar and gpsimd engines each run their instructions
one at a time, in program order. DMA transfers share the DMA engines'
bandwidth: a transfer's bytes move in the earliest window after its inputs
are ready in which no other transfer's bytes move (a transfer issued later
may fill an earlier gap: the 16 queues do not wait for each other), and its
fixed latency overlaps the others' (as in the compiler's TimePlan). An elementwise
instruction that waits on another engine's result pays the engine's
dependent overhead (CostModel::Elementwise's `dependent`).
"""

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
        self.free = {e: 0.0 for e in ENGINES}
        self.instructions = []
        self.dma_busy = []  # (start, end) windows of the DMA bandwidth, sorted

    def ready(self, reads, writes):
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
        start = max(self.free[engine], deps)
        duration = cost(deps > self.free[engine])
        end = start + duration
        self.free[engine] = end
        self._finish(reads, writes, end)
        self.instructions.append(Instruction(name, engine, start, end, line))
        return end

    def issue_dma(self, name, nbytes, partitions, reads, writes, line):
        """Schedules one DMA: its bytes move on the shared bandwidth after
        the previous transfer's, its latency overlaps."""
        total, latency = _C._nki_dma_us(int(nbytes), max(1, int(partitions)))
        moving = self._dma_window(self.ready(reads, writes), total - latency)
        end = moving + total
        self._finish(reads, writes, end)
        self.instructions.append(Instruction(name, "dma", moving, end, line))
        return end

    def _dma_window(self, earliest, length):
        """The start of the first free window of `length` at or after
        `earliest` in the DMA bandwidth's busy windows; books it."""
        start = earliest
        index = 0
        for index, (busy_start, busy_end) in enumerate(self.dma_busy):
            if start + length <= busy_start:
                break
            start = max(start, busy_end)
        else:
            index = len(self.dma_busy)
        self.dma_busy.insert(index, (start, start + length))
        self.free["dma"] = max(self.free["dma"], start + length)
        return start

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
