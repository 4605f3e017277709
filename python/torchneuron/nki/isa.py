"""torchneuron.nki.isa (nisa): single engine instructions, after AWS NKI's
nki.isa, with the engines' operand rules.

nc_matmul(stationary, moving) -> PSUM float32 [M, N] = stationary.T @ moving:
  both operands in SBUF, their partition dimensions (the contraction K)
  equal and <= the tensor engine's pe_rows (128), the stationary free size
  M <= pe_columns (128), the moving free size N <= max_moving_free (512);
  float8/bfloat16/float16/float32 inputs (float32 at the spec's slowdown).
  Accumulate K > 128 with `acc += nisa.nc_matmul(...)` into a PSUM tile.
"""

import torch

from .. import _C
from . import kernel as _kernel
from . import language as nl
from .errors import fail
from .tiles import PSUM, SBUF, Tile

_MATMUL_DTYPES = (torch.bfloat16, torch.float16, torch.float32,
                  getattr(torch, "float8_e4m3fn", torch.bfloat16),
                  getattr(torch, "float8_e5m2", torch.bfloat16))


def _check_matmul_operand(tile, role):
    nl.check_read(tile, f"nisa.nc_matmul's {role}")
    if tile.buffer != SBUF:
        fail(f"nisa.nc_matmul's {role} is a {tile.buffer.upper()} tile: the tensor "
             f"engine reads SBUF (copy it with nl.copy first)")
    if len(tile.shape) != 2:
        fail(f"nisa.nc_matmul's {role} has shape {tile.shape}: the tensor engine takes "
             f"2-D tiles [partition, free]")
    if tile.dtype not in _MATMUL_DTYPES:
        fail(f"nisa.nc_matmul's {role} is {tile.dtype}: the tensor engine takes float8, "
             f"bfloat16, float16 or float32")


def nc_matmul(stationary, moving):
    """stationary [K, M] and moving [K, N] (SBUF) -> PSUM float32 [M, N]."""
    _check_matmul_operand(stationary, "stationary")
    _check_matmul_operand(moving, "moving")
    spec = _kernel.spec()
    (k, m), (k2, n) = stationary.shape, moving.shape
    if k != k2:
        fail(f"nisa.nc_matmul: stationary {stationary.shape} and moving {moving.shape} "
             f"differ in the partition (contraction) dimension")
    if k > spec["pe_rows"]:
        fail(f"nisa.nc_matmul: contraction over {k} partitions; the tensor engine "
             f"contracts at most {spec['pe_rows']}")
    if m > spec["pe_columns"]:
        fail(f"nisa.nc_matmul: stationary free size {m} (shape {stationary.shape}); the "
             f"tensor engine's stationary tile holds at most {spec['pe_columns']}")
    if n > spec["max_moving_free"]:
        fail(f"nisa.nc_matmul: moving free size {n} (shape {moving.shape}); the tensor "
             f"engine's moving tile holds at most {spec['max_moving_free']}")
    fp32 = stationary.dtype == torch.float32 or moving.dtype == torch.float32
    result = nl.new_tile((m, n), torch.float32, PSUM)
    nl.issue("nc_matmul", "tensor", lambda _: _C._nki_matmul_us(m, k, n, fp32),
             [stationary, moving], [result])
    nl.write(result, stationary.data.float().t() @ moving.data.float())
    result.from_matmul = True
    return result


def nc_transpose(x):
    """x [P, F] (SBUF) -> PSUM [F, P] of x's dtype: a matmul of x (stationary)
    with the identity (moving [P, P]) on the tensor engine."""
    _check_matmul_operand(x, "stationary (transposed tile)")
    p, f = x.shape
    if f > _kernel.spec()["pe_columns"]:
        fail(f"nisa.nc_transpose: a tile of shape {x.shape} has free size {f}; the "
             f"transposed tile's partitions hold at most {_kernel.spec()['pe_columns']}")
    result = nl.new_tile((f, p), x.dtype, PSUM)
    fp32 = x.dtype == torch.float32
    nl.issue("nc_transpose", "tensor", lambda _: _C._nki_matmul_us(f, p, p, fp32), [x],
             [result])
    nl.write(result, x.data.t())
    return result


def activation(op, data, bias=None, scale=1.0, dtype=None):
    """op(data * scale + bias) on the scalar engine, one instruction: `op` a
    language function (nl.exp, nl.tanh, ...) or None (identity); `bias` a
    tile [P, 1] (per partition) or a number; `scale` a number or a [P, 1]
    tile."""
    fn = _ACTIVATIONS.get(op, None)
    if op is not None and fn is None:
        fail(f"nisa.activation: {getattr(op, '__name__', op)} is not a scalar engine "
             f"activation (nl.exp, nl.log, nl.tanh, nl.sigmoid, nl.sqrt, nl.rsqrt, nl.relu)")
    extras = [t for t in (bias, scale) if isinstance(t, Tile)]
    for extra in extras:
        nl.check_read(extra, "nisa.activation")
        if extra.shape != (data.shape[0], 1):
            fail(f"nisa.activation: a bias or scale tile of shape {extra.shape}; it "
                 f"must be [{data.shape[0]}, 1] (one value per partition)")
    b = bias.data.float() if isinstance(bias, Tile) else (bias or 0.0)
    s = scale.data.float() if isinstance(scale, Tile) else scale
    return nl.elementwise("activation", "scalar", [data],
                          lambda a: (fn or (lambda v: v))(a * s + b), dtype=dtype,
                          extra_reads=extras)


_ACTIVATIONS = {nl.exp: torch.exp, nl.log: torch.log, nl.tanh: torch.tanh,
                nl.sigmoid: torch.sigmoid, nl.sqrt: torch.sqrt, nl.rsqrt: torch.rsqrt,
                nl.relu: torch.relu}


def activation_reduce(op, data, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None):
    """nisa.activation, and in the same scalar engine instruction its
    result's reduction along the free dimension (reduce_op: nl.add / nl.sum
    or nl.maximum / nl.max) written into `reduce_res`, a [P, 1] tile."""
    result = activation(op, data, bias=bias, scale=scale, dtype=dtype)
    reduce = {nl.add: torch.sum, nl.sum: torch.sum, nl.maximum: torch.amax,
              nl.max: torch.amax}.get(reduce_op)
    if reduce is None:
        fail(f"nisa.activation_reduce: reduce_op {getattr(reduce_op, '__name__', reduce_op)} "
             f"is not nl.add or nl.maximum")
    if not isinstance(reduce_res, Tile) or reduce_res.shape != (data.shape[0], 1):
        fail(f"nisa.activation_reduce: reduce_res must be a [{data.shape[0]}, 1] tile")
    reduce_res.alloc.ready_us = max(reduce_res.alloc.ready_us, result.alloc.ready_us)
    nl.write(reduce_res, reduce(result.data.float(), dim=1, keepdim=True))
    return result


_TENSOR_TENSOR = {nl.add: torch.add, nl.subtract: torch.sub, nl.multiply: torch.mul,
                  nl.divide: torch.div, nl.maximum: torch.maximum, nl.minimum: torch.minimum}


def _two_ops(op0, op1, where):
    """The torch functions of an instruction's op0 and op1."""
    f0, f1 = _TENSOR_TENSOR.get(op0), _TENSOR_TENSOR.get(op1)
    if f0 is None or f1 is None:
        fail(f"{where}: op0 and op1 are nl.add, nl.subtract, nl.multiply, nl.divide, "
             "nl.maximum or nl.minimum")
    return f0, f1


def _column_operand(x, partitions, where, name):
    """Checks an operand that is a number or a [partitions, 1] tile; returns
    the tiles it reads (for the instruction's extra reads)."""
    if not isinstance(x, Tile):
        return []
    nl.check_read(x, where)
    if x.shape != (partitions, 1):
        fail(f"{where}: {name} of shape {x.shape}; it must be a number or [{partitions}, 1]")
    return [x]


def scalar_tensor_tensor(data, op0, operand0, op1, operand1, dtype=None):
    """(data op0 operand0) op1 operand1 in one vector engine instruction:
    operand0 a number or a [P, 1] tile, operand1 a tile of data's shape
    (op0, op1: nl.add, nl.subtract, nl.multiply, nl.maximum, ...)."""
    f0, f1 = _two_ops(op0, op1, "nisa.scalar_tensor_tensor")
    extras = _column_operand(operand0, data.shape[0], "nisa.scalar_tensor_tensor", "operand0")
    s = operand0.data.float() if isinstance(operand0, Tile) else torch.tensor(float(operand0))
    return nl.elementwise("scalar_tensor_tensor", "vector", [data, operand1],
                          lambda a, b: f1(f0(a, s), b), dtype=dtype, extra_reads=extras)


def tensor_copy(src, dtype=None, engine="vector"):
    """A copy into a new SBUF tile on the vector, scalar or gpsimd engine."""
    return nl.copy(src, dtype=dtype, engine=engine)


def tensor_tensor(x, y, op, dtype=None, engine="vector"):
    """op(x, y) elementwise (op: nl.add, nl.subtract, nl.multiply,
    nl.divide, nl.maximum, nl.minimum) on the vector engine, or the gpsimd
    engine to balance them."""
    fn = _TENSOR_TENSOR.get(op)
    if fn is None:
        fail(f"nisa.tensor_tensor: op {getattr(op, '__name__', op)} is not nl.add, "
             f"nl.subtract, nl.multiply, nl.divide, nl.maximum or nl.minimum")
    if engine not in ("vector", "gpsimd"):
        fail(f"nisa.tensor_tensor: engine {engine!r} does not run it (vector or gpsimd)")
    return nl.elementwise(op.__name__, engine, [x, y],
                          lambda a, b: fn(torch.as_tensor(a), torch.as_tensor(b)),
                          dtype=dtype)


def tensor_tensor_scan(data0, data1, initial, op0, op1, dtype=None):
    """The vector engine's scan along the free dimension of two [P, F]
    tiles of one shape, in float32 (NKI's operand order):

        result[:, 0] = op1(op0(data0[:, 0], initial), data1[:, 0])
        result[:, i] = op1(op0(data0[:, i], result[:, i - 1]), data1[:, i])

    `initial` a number or a [P, 1] tile (a previous scan's last column);
    op0, op1 as for tensor_tensor (a linear recurrence h_i = a_i h_{i-1} +
    b_i is op0 = nl.multiply, op1 = nl.add); data0 and data1 not both in
    PSUM. One instruction: each lane walks its F elements of both inputs in
    order."""
    f0, f1 = _two_ops(op0, op1, "nisa.tensor_tensor_scan")
    for t in (data0, data1):
        nl.check_read(t, "nisa.tensor_tensor_scan")
        if not isinstance(t, Tile) or len(t.shape) != 2:
            fail(f"nisa.tensor_tensor_scan takes 2-D tiles [partition, free], got shape "
                 f"{getattr(t, 'shape', t)}")
    if data0.shape != data1.shape:
        fail(f"nisa.tensor_tensor_scan: data0 {data0.shape} and data1 {data1.shape} differ")
    if data0.buffer == PSUM and data1.buffer == PSUM:
        fail("nisa.tensor_tensor_scan: data0 and data1 are both PSUM tiles; the vector "
             "engine's scan reads at most one operand from PSUM (copy one to SBUF)")
    extras = _column_operand(initial, data0.shape[0], "nisa.tensor_tensor_scan", "initial")
    start = initial.data.float()[:, 0] if isinstance(initial, Tile) else float(initial)

    def scan(a, b):
        out, carry = torch.empty_like(a), torch.as_tensor(start).expand(a.shape[0])
        for i in range(a.shape[1]):
            carry = f1(f0(a[:, i], carry), b[:, i])
            out[:, i] = carry
        return out
    return nl.elementwise("tensor_tensor_scan", "vector", [data0, data1], scan,
                          dtype=dtype, extra_reads=extras)


def tensor_reduce(op, data, axis, dtype=None, keepdims=True):
    """A free-axis reduction on the vector engine (op: nl.max, nl.sum, ...)."""
    return op(data, axis, dtype=dtype, keepdims=keepdims)


def affine_select(data, on_false_value, partition_step=1, free_step=-1, offset=0,
                  dtype=None):
    """data where offset + p * partition_step + f * free_step >= 0 (p the
    partition index, f the free index of a 2-D tile), else on_false_value:
    the gpsimd engine's masked select (a causal mask: the defaults keep
    f <= p + offset)."""
    def select(a):
        p = torch.arange(a.shape[0]).unsqueeze(1)
        f = torch.arange(a.shape[1]).unsqueeze(0)
        keep = offset + p * partition_step + f * free_step >= 0
        return torch.where(keep, a, torch.tensor(float(on_false_value)))
    if len(data.shape) != 2:
        fail(f"nisa.affine_select takes a 2-D tile, got shape {data.shape}")
    return nl.elementwise("affine_select", "gpsimd", [data], select, dtype=dtype)
