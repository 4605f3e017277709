"""Tiles in SBUF and PSUM, and the HBM tensors a kernel reads and writes.

A Tile is a block of on-chip memory: its first dimension is the partition
dimension (at most the spec's 128 partitions), the others its free
dimensions, held by every partition. Its values are a CPU tensor (`data`);
`written` marks which elements a kernel instruction has written, so reading
one that was never written is an error. Views (tile[i0:i1, j0:j1]) share
the data, the marks and the allocation.

Memory counts the bytes each partition holds in live tiles, per buffer: a
tile is charged when created and released when the last Python reference to
it (or a view of it) goes, so a loop that rebinds a name reuses the space as
the hardware's allocator would. A tile that would take a buffer over its
capacity is an error.

An HbmTensor is a kernel argument or output in device memory (HBM): slicing
gives a view; nl.load and nl.store move data between views and tiles.
"""

import math
import weakref

import torch

from .errors import fail

SBUF, PSUM, HBM = "sbuf", "psum", "hbm"


class Allocation:
    """One tile's space: its buffer, bytes per partition, and its
    scheduling state (when its last writer ends, when its readers end)."""

    def __init__(self, buffer, bytes_per_partition):
        self.buffer = buffer
        self.bytes_per_partition = bytes_per_partition
        self.ready_us = 0.0
        self.read_until_us = 0.0


class Memory:
    """Live bytes per partition of SBUF and PSUM in one kernel run, and
    their peaks, against the spec's capacities."""

    def __init__(self, spec):
        self.spec = spec
        self.capacity = {SBUF: spec["sbuf_bytes_per_partition"],
                         PSUM: spec["psum_bytes_per_partition"]}
        self.live = {SBUF: 0, PSUM: 0}
        self.peak = {SBUF: 0, PSUM: 0}

    def allocate(self, buffer, shape, dtype):
        partitions = shape[0] if shape else 1
        limit = self.spec["partitions"]
        if partitions > limit:
            fail(f"a {buffer.upper()} tile of shape {tuple(shape)} has {partitions} "
                 f"partitions: the partition dimension (the first) holds at most {limit}")
        nbytes = math.prod(shape[1:]) * _itemsize(dtype)
        if buffer == PSUM:
            bank = self.capacity[PSUM] // self.spec["psum_banks"]
            if nbytes > bank:
                fail(f"a PSUM tile of shape {tuple(shape)} ({dtype_name(dtype)}) needs "
                     f"{nbytes} bytes per partition: a PSUM tile fits one bank "
                     f"({bank} bytes per partition, {bank // 4} float32)")
        if self.live[buffer] + nbytes > self.capacity[buffer]:
            fail(f"{buffer.upper()} over capacity: a tile of shape {tuple(shape)} "
                 f"({dtype_name(dtype)}, {nbytes} bytes per partition) on top of "
                 f"{self.live[buffer]} live bytes per partition exceeds the "
                 f"{self.capacity[buffer]} bytes a partition holds")
        self.live[buffer] += nbytes
        self.peak[buffer] = max(self.peak[buffer], self.live[buffer])
        alloc = Allocation(buffer, nbytes)
        weakref.finalize(alloc, self._release, buffer, nbytes)
        return alloc

    def _release(self, buffer, nbytes):
        self.live[buffer] -= nbytes


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class Tile:
    """A tile (or a view of one) in SBUF or PSUM. Create tiles with the
    language's functions (nl.ndarray, nl.load, engine ops), not directly."""

    def __init__(self, data, written, alloc):
        self.data = data
        self.written = written
        self.alloc = alloc

    @property
    def buffer(self):
        return self.alloc.buffer

    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __getitem__(self, index):
        index = _partition_kept(index, "a tile")
        return Tile(self.data[index], self.written[index], self.alloc)

    def __setitem__(self, index, value):
        from . import language
        index = _partition_kept(index, "a tile")
        language.copy_into(Tile(self.data[index], self.written[index], self.alloc), value)

    def __iadd__(self, other):
        from . import language
        return language.accumulate(self, other)

    def __repr__(self):
        return f"Tile({self.buffer}, {self.shape}, {dtype_name(self.dtype)})"


def _partition_kept(index, what):
    """Indexing keeps the partition dimension: an integer there would
    make a free dimension the partition one."""
    first = index[0] if isinstance(index, tuple) else index
    if isinstance(first, int):
        fail(f"indexing {what} with an integer on the partition dimension; use a "
             f"slice ({first}:{first + 1})")
    return index


class HbmTensor:
    """A tensor in device memory (HBM) a kernel reads or writes: `data` is a
    CPU tensor over its bytes."""

    def __init__(self, data, name="hbm"):
        self.data = data
        self.name = name

    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def __getitem__(self, index):
        return HbmTensor(self.data[index], self.name)

    def reshape(self, *shape):
        """A view of other dimensions (an access pattern: no data moves)."""
        return HbmTensor(self.data.reshape(*shape), self.name)

    def permute(self, *dims):
        """A view with its dimensions reordered (an access pattern: a DMA
        reading it gathers strided bytes)."""
        return HbmTensor(self.data.permute(*dims), self.name)

    def broadcast_to(self, *shape):
        """A view repeating dimensions of size 1 (an access pattern of
        stride 0: a DMA reading it moves every repeated byte). A row
        [1, F] broadcast to [128, F] loads the same row into every
        partition."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        try:
            return HbmTensor(self.data.expand(*shape), self.name)
        except RuntimeError:
            fail(f"broadcasting HBM tensor {self.name} of shape {self.shape} to {shape}: "
                 f"only dimensions of size 1 repeat")

    def __setitem__(self, index, value):
        fail(f"assigning to HBM tensor {self.name}: write HBM with nl.store(dst, value=tile)")

    def __repr__(self):
        return f"HbmTensor({self.name}, {self.shape}, {dtype_name(self.dtype)})"
