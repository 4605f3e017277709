"""torchneuron.nki.language (nl): the kernel language's tiles and operations,
after AWS NKI's nki.language.

Memory: nl.sbuf and nl.psum hold tiles (partition dimension first, at most
128); nl.shared_hbm holds a kernel's outputs. Data moves with nl.load (HBM
view -> SBUF tile) and nl.store (SBUF tile -> HBM view) on the DMA engines.
Operations take tiles (SBUF or PSUM) and Python numbers and make a new SBUF
tile: the tensor engine's nl.matmul / nl.transpose (results in PSUM,
float32), the vector engine's arithmetic and free-axis reductions, the
scalar engine's transcendentals (exp, tanh, ...). Loops are Python loops:
nl.affine_range, nl.sequential_range and nl.static_range are `range`.

Every operation checks its operands (partition sizes, buffers, written
elements), computes its values with torch (in float32, then cast to the
result's dtype) and issues one instruction priced by the device model.
"""

import builtins
import math

import torch

from .. import _C
from . import kernel as _kernel
from .errors import fail, user_line
from .tiles import HBM, PSUM, SBUF, HbmTensor, Tile

sbuf, psum, hbm = SBUF, PSUM, HBM
shared_hbm = private_hbm = HBM

float32, bfloat16, float16 = torch.float32, torch.bfloat16, torch.float16
int32, int8, uint8 = torch.int32, torch.int8, torch.uint8

affine_range = sequential_range = static_range = range


class tile_size:  # noqa: N801 (NKI's name)
    """The tensor engine's and buffers' tile limits (NeuronCore-v2..v4)."""
    pmax = 128              # partitions of a tile
    psum_fmax = 512         # float32 free elements of a PSUM tile (one 2 KiB bank)
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512


# ---- tiles and their bookkeeping ------------------------------------------

def new_tile(shape, dtype, buffer):
    """A fresh, unwritten tile charged to `buffer`."""
    shape = tuple(int(s) for s in shape)
    alloc = _kernel.current().memory.allocate(buffer, shape, dtype)
    data = torch.zeros(shape, dtype=dtype)
    return Tile(data, torch.zeros(shape, dtype=torch.bool), alloc)


def check_read(tile, what):
    """`tile` must be a tile whose every element was written."""
    if isinstance(tile, HbmTensor):
        fail(f"{what} reads HBM tensor {tile.name} directly: nl.load it into SBUF first")
    if not isinstance(tile, Tile):
        fail(f"{what} takes a tile, got {type(tile).__name__}")
    if not bool(tile.written.all()):
        unwritten = int((~tile.written).sum())
        fail(f"{what} reads a {tile.buffer.upper()} tile of shape {tile.shape} with "
             f"{unwritten} unwritten element(s): write it first (nl.load, an "
             f"operation, or tile[...] = ...)")


def write(tile, values):
    tile.data.copy_(values.to(tile.dtype))
    tile.written.fill_(True)


def free_size(shape):
    return math.prod(shape[1:]) if len(shape) > 1 else 1


def issue(name, engine, cost, reads, writes):
    """Issues one instruction reading and writing tiles; returns its end."""
    run = _kernel.current()
    return run.schedule.issue(name, engine, cost, [t.alloc for t in reads],
                              [t.alloc for t in writes], user_line())


def engine_cost(engine, shape, inputs):
    """An instruction over a tile of `shape` on a vector-style engine: the
    lanes are the partitions, each walks the free elements."""
    elements = _kernel.spec()["partitions"] * free_size(shape)
    return lambda dependent: _C._nki_elementwise_us(engine, elements, builtins.max(1, inputs),
                                                    dependent)


def elementwise(name, engine, operands, compute, dtype=None, out=None, reduces=False,
                extra_reads=()):
    """An engine instruction over tiles and numbers: checks the tiles,
    computes `compute(*float32 operands)` into a new SBUF tile (or `out`);
    it costs the engine's pass over the operands' (broadcast) shape;
    `extra_reads` are per-partition operands (a bias) it waits for, free."""
    tiles = [o for o in operands if not isinstance(o, (int, float))]
    for t in tiles:
        check_read(t, f"nl.{name}")
    shape_in = _broadcast_shape(name, tiles)
    values = compute(*[o.data.float() if isinstance(o, Tile) else o for o in operands])
    shape = tuple(values.shape) if reduces else shape_in
    values = torch.broadcast_to(values, shape) if tuple(values.shape) != shape else values
    dtype = dtype or (tiles[0].dtype if tiles else torch.float32)
    result = out if out is not None else new_tile(shape, dtype, SBUF)
    if out is not None and out.shape != shape:
        fail(f"nl.{name}: result of shape {shape} written to a tile of shape {out.shape}")
    issue(name, engine, engine_cost(engine, shape_in, len(tiles)), tiles + list(extra_reads),
          [result])
    write(result, values)
    return result


def _broadcast_shape(name, tiles):
    if not tiles:
        fail(f"nl.{name} needs at least one tile operand")
    partitions = {t.shape[0] for t in tiles}
    if len(partitions) > 1:
        fail(f"nl.{name}: operands of shapes {[t.shape for t in tiles]} differ in the "
             f"partition dimension; engines broadcast along free dimensions only")
    try:
        return tuple(torch.broadcast_shapes(*[t.shape for t in tiles]))
    except RuntimeError:
        fail(f"nl.{name}: operands of shapes {[t.shape for t in tiles]} do not broadcast")


# ---- memory: allocation, loads and stores ---------------------------------

def ndarray(shape, dtype, buffer=SBUF):
    """An unwritten tile in nl.sbuf or nl.psum, or a kernel output in
    nl.shared_hbm (a zero-filled HbmTensor)."""
    if buffer == HBM:
        return HbmTensor(torch.zeros(tuple(shape), dtype=dtype), "output")
    if buffer not in (SBUF, PSUM):
        fail(f"nl.ndarray: unknown buffer {buffer!r} (nl.sbuf, nl.psum, nl.shared_hbm)")
    return new_tile(shape, dtype, buffer)


def full(shape, fill_value, dtype, buffer=SBUF):
    """A tile set to `fill_value` (a memset on the gpsimd engine)."""
    tile = ndarray(shape, dtype, buffer)
    if isinstance(tile, HbmTensor):
        tile.data.fill_(fill_value)
        return tile
    issue("memset", "gpsimd", engine_cost("gpsimd", tile.shape, 1), [], [tile])
    write(tile, torch.full(tile.shape, float(fill_value)))
    return tile


def zeros(shape, dtype, buffer=SBUF):
    return full(shape, 0.0, dtype, buffer)


def load(src, dtype=None):
    """DMA: an HBM view into a new SBUF tile (its first dimension the
    partition one)."""
    if not isinstance(src, HbmTensor):
        fail(f"nl.load reads an HBM tensor, got {type(src).__name__}")
    shape = src.shape if src.shape else (1,)
    tile = new_tile(shape, dtype or src.dtype, SBUF)
    nbytes = src.data.numel() * src.data.element_size()
    run = _kernel.current()
    run.schedule.issue_dma("load", nbytes, shape[0], [], [tile.alloc], user_line())
    run.hbm_bytes += nbytes
    write(tile, src.data.reshape(shape))
    return tile


def store(dst, value):
    """DMA: an SBUF tile into an HBM view of the same shape."""
    if not isinstance(dst, HbmTensor):
        fail(f"nl.store writes an HBM tensor, got {type(dst).__name__}")
    check_read(value, "nl.store")
    if value.buffer != SBUF:
        fail(f"nl.store reads SBUF; the value is a {value.buffer.upper()} tile (copy it "
             f"to SBUF with nl.copy first)")
    if any(st == 0 and n > 1 for st, n in zip(dst.data.stride(), dst.data.shape)):
        fail(f"nl.store into a broadcast view of HBM tensor {dst.name} (shape {dst.shape}): "
             f"several elements would share one address")
    if value.data.numel() != dst.data.numel():
        fail(f"nl.store: a tile of shape {value.shape} into an HBM view of shape {dst.shape}")
    nbytes = dst.data.numel() * dst.data.element_size()
    run = _kernel.current()
    run.schedule.issue_dma("store", nbytes, value.shape[0], [value.alloc], [], user_line())
    run.hbm_bytes += nbytes
    dst.data.copy_(value.data.reshape(dst.shape).to(dst.dtype))


# ---- tensor engine ---------------------------------------------------------

def matmul(x, y, transpose_x=False):
    """x @ y into PSUM (float32). With transpose_x, x is given as [K, M]
    (the stationary operand as the engine takes it); otherwise x [M, K] is
    first transposed on the tensor engine (nl.transpose, then a copy to SBUF)."""
    from . import isa
    if not transpose_x:
        x = copy(transpose(x))
    return isa.nc_matmul(x, y)


def transpose(x):
    """x [P, F] -> PSUM [F, P] on the tensor engine (a matmul with the
    identity: P x F x P)."""
    from . import isa
    return isa.nc_transpose(x)


# ---- vector and scalar engines --------------------------------------------

def copy(x, dtype=None, engine="vector"):
    """A copy of x into a new SBUF tile: PSUM -> SBUF, or a change of dtype;
    on the vector engine, or the scalar or gpsimd engine to balance them."""
    if engine not in ("vector", "scalar", "gpsimd"):
        fail(f"nl.copy: engine {engine!r} does not copy (vector, scalar or gpsimd)")
    return elementwise("copy", engine, [x], lambda a: a, dtype=dtype)


def copy_into(dst, value, engine="vector"):
    """tile[...] = value: a vector engine copy (or memset for a number)."""
    if isinstance(value, (int, float)):
        issue("memset", "gpsimd", engine_cost("gpsimd", dst.shape, 1), [], [dst])
        write(dst, torch.full(dst.shape, float(value)))
        return
    check_read(value, "tile assignment")
    if value.shape != dst.shape:
        fail(f"assigning a tile of shape {value.shape} to a tile region of shape {dst.shape}")
    elementwise("copy", engine, [value], lambda a: a, dtype=dst.dtype, out=dst)


def accumulate(acc, other):
    """acc += other. Into PSUM from a matmul result: the tensor engine's
    accumulation, no extra instruction; otherwise a vector engine add."""
    if acc.buffer == PSUM and isinstance(other, Tile) and other.buffer == PSUM \
            and getattr(other, "from_matmul", False):
        check_read(other, "PSUM accumulation")
        if other.shape != acc.shape:
            fail(f"accumulating a matmul result of shape {other.shape} into a PSUM tile "
                 f"of shape {acc.shape}")
        base = torch.where(acc.written, acc.data.float(), torch.zeros(()))
        acc.alloc.ready_us = builtins.max(acc.alloc.ready_us, other.alloc.ready_us)
        write(acc, base + other.data.float())
        return acc
    return elementwise("add", "vector", [acc, other], torch.add, dtype=acc.dtype, out=acc)


def _binary(name, fn):
    def op(x, y, dtype=None):
        return elementwise(name, "vector", [x, y], fn, dtype=dtype)
    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of two tiles (or a tile and a number): vector engine."
    return op


add = _binary("add", torch.add)
subtract = _binary("subtract", torch.sub)
multiply = _binary("multiply", torch.mul)
divide = _binary("divide", torch.div)
maximum = _binary("maximum", lambda a, b: torch.maximum(torch.as_tensor(a), torch.as_tensor(b)))
minimum = _binary("minimum", lambda a, b: torch.minimum(torch.as_tensor(a), torch.as_tensor(b)))


def _unary(name, engine, fn):
    def op(x, dtype=None):
        return elementwise(name, engine, [x], fn, dtype=dtype)
    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of a tile: {engine} engine."
    return op


exp = _unary("exp", "scalar", torch.exp)
log = _unary("log", "scalar", torch.log)
tanh = _unary("tanh", "scalar", torch.tanh)
sigmoid = _unary("sigmoid", "scalar", torch.sigmoid)
sqrt = _unary("sqrt", "scalar", torch.sqrt)
rsqrt = _unary("rsqrt", "scalar", torch.rsqrt)
relu = _unary("relu", "scalar", torch.relu)
negative = _unary("negative", "vector", torch.neg)
reciprocal = _unary("reciprocal", "vector", torch.reciprocal)


def _reduction(name, fn):
    def op(x, axis, dtype=None, keepdims=True):
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        rank = len(x.shape) if isinstance(x, Tile) else 0
        axes = tuple(a % rank for a in axes) if rank else axes
        if 0 in axes:
            fail(f"nl.{name} over the partition dimension (axis 0): the vector engine "
                 f"reduces free dimensions (axis >= 1) only")
        return elementwise(name, "vector", [x], lambda a: fn(a, axes, keepdims),
                           dtype=dtype, reduces=True)
    op.__name__ = name
    op.__doc__ = f"{name} over free axes of a tile: vector engine."
    return op


max = _reduction("max", lambda a, axes, k: a.amax(dim=axes, keepdim=k))  # noqa: A001
min = _reduction("min", lambda a, axes, k: a.amin(dim=axes, keepdim=k))  # noqa: A001
sum = _reduction("sum", lambda a, axes, k: a.sum(dim=axes, keepdim=k))  # noqa: A001
mean = _reduction("mean", lambda a, axes, k: a.mean(dim=axes, keepdim=k))
