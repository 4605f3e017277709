"""Mamba's selective scan as a kernel: selective_scan(x, delta, A, B, C) -> y,
the scan of torchneuron.models.ssm (its reference), per batch b, channel d
and state n:

    h_t[d, n] = exp(-delta_t[d] A[d]) h_{t-1}[d, n] + delta_t[d] x_t[d] B_t[n]
    y_t[d]    = sum_n C_t[n] h_t[d, n]                  (h_{-1} = 0)

x, delta, y: [batch, T, inner]; A: [inner] (the model's positive decay
rates); B, C: [batch, T, state]. The skip D x and the gate are the model's,
outside the scan.

Tiled as AWS's NKI Mamba kernels are: 128 channels on the partitions, time
along the free dimension, the recurrence along time on the vector engine
(nisa.tensor_tensor_scan: one instruction walks each lane's chunk of time),
a scan per state. Per (b, tile of 128 channels, chunk of up to 512 time
steps):

    x, delta       DMA  (the [T, inner] rows read as [channels, time])
    dA = exp(-A delta)   scalar engine (A a per-partition scale)
    du = delta x         vector engine
    per state n:
      B_n, C_n broadcast over the channels: tensor engine, a ones row [1, 128]
               times the state's row of B or C ([1, chunk], all states
               loaded with one DMA), into PSUM ([128, 512] float32, a bank)
      dBu = du B_n       gpsimd engine
      h   = scan(dA, dBu, initial = the previous chunk's last h)   vector
      y  += C_n h        gpsimd multiply, vector add
      carry[:, n] = h[:, last]   scalar engine copy (the next chunk's initial)
    y      DMA back into [T, inner]

so the engines share the work (gpsimd and vector each pass over 4 chunk
elements per lane and state, the tensor engine broadcasts, the scalar
engine exponentiates and carries). Everything is computed in float32, y
rounded to x's dtype. h never reaches HBM: the kernel moves x, delta, A, B,
C and y only, where the model's closed form makes [batch, inner, T, T]
decays and weights.
"""

import torch

from . import isa as nisa
from . import language as nl
from .kernel import jit

CHUNK = 512  # time steps per tile: a [128, 512] float32 broadcast fills one PSUM bank


def selective_scan_reference(x, delta, A, B, C):
    """torchneuron.models.ssm.selective_scan in float64, in x's dtype."""
    from ..models import ssm
    t = x.shape[1]
    mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    y = ssm.selective_scan(x.double(), delta.double(), A.double(), B.double(),
                           C.double(), mask)
    return y.to(x.dtype)


@jit(reference=selective_scan_reference)
def selective_scan(x, delta, A, B, C):
    batch, seq, inner = x.shape
    state = B.shape[2]
    y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ones = nl.full((1, nl.tile_size.pmax), 1.0, dtype=B.dtype)   # stationary [1, 128]
    for b in nl.affine_range(batch):
        for c0 in nl.affine_range(0, inner, nl.tile_size.pmax):
            channels = slice(c0, min(inner, c0 + nl.tile_size.pmax))
            neg_a = nl.multiply(nl.load(A[channels].reshape(-1, 1)), -1.0,
                                dtype=nl.float32)
            carry = None
            for t0 in nl.sequential_range(0, seq, CHUNK):
                times = slice(t0, min(seq, t0 + CHUNK))
                rows = (b, times, channels)
                carry = _chunk(y[rows].permute(1, 0), x[rows].permute(1, 0),
                               delta[rows].permute(1, 0), neg_a,
                               state_rows(B, b, times, state),
                               state_rows(C, b, times, state), ones, carry)
    return y


def state_rows(view, b, times, state):
    """B or C [batch, T, state] at (b, times) as one SBUF row [1, state *
    chunk]: state n's chunk at [n * chunk, (n + 1) * chunk) (one DMA)."""
    rows = view[b, times, :].permute(1, 0)                          # [state, chunk]
    return nl.load(rows.reshape(1, state * rows.shape[1]))


def _chunk(out, x, delta, neg_a, b_rows, c_rows, ones, carry):
    """One chunk of one channel tile: x, delta, out HBM [channels, chunk]
    views; carry the previous chunk's last h [channels, state] (None at the
    start). Returns this chunk's last h."""
    decay, du, _, _ = chunk_inputs(x, delta, neg_a)
    length = x.shape[1]
    last = nl.ndarray((x.shape[0], b_rows.shape[1] // length), dtype=nl.float32)
    acc = None
    for n in nl.static_range(last.shape[1]):
        h, _ = state_scan(decay, du, b_rows, n, ones, carry, last)
        c_n = broadcast(ones, c_rows[:, n * length:(n + 1) * length], x.shape[0])
        ch = nisa.tensor_tensor(h, c_n, nl.multiply, dtype=nl.float32, engine="gpsimd")
        acc = ch if acc is None else nl.add(acc, ch)
    if acc.dtype != out.dtype:
        acc = nl.copy(acc, dtype=out.dtype, engine="scalar")
    nl.store(out, value=acc)
    return last


def chunk_inputs(x, delta, neg_a):
    """A chunk's decays exp(-A delta) (scalar engine) and delta x (vector
    engine), float32 [channels, chunk], from the HBM views x, delta; and
    the loaded delta and x tiles."""
    delta_t, x_t = nl.load(delta), nl.load(x)
    decay = nisa.activation(nl.exp, delta_t, scale=neg_a, dtype=nl.float32)
    return decay, nl.multiply(delta_t, x_t, dtype=nl.float32), delta_t, x_t


def state_scan(decay, du, b_rows, n, ones, carry, last):
    """h [channels, chunk] (float32) of state n over one chunk: B_n
    broadcast over the channels (tensor engine), du B_n (gpsimd engine),
    the scan from carry[:, n] (0 when carry is None; vector engine); h's
    last column copied into last[:, n] (scalar engine) unless last is None.
    Returns h and the broadcast B_n (PSUM)."""
    length = decay.shape[1]
    b_n = broadcast(ones, b_rows[:, n * length:(n + 1) * length], decay.shape[0])
    dbu = nisa.tensor_tensor(du, b_n, nl.multiply, dtype=nl.float32, engine="gpsimd")
    initial = 0.0 if carry is None else carry[:, n:n + 1]
    h = nisa.tensor_tensor_scan(decay, dbu, initial, nl.multiply, nl.add)
    if last is not None:
        nl.copy_into(last[:, n:n + 1], h[:, length - 1:length], engine="scalar")
    return h, b_n


def broadcast(ones, row, partitions):
    """row [1, F] onto `partitions` partitions: ones[1, P].T @ row on the
    tensor engine, into PSUM [P, F] (float32)."""
    return nisa.nc_matmul(ones[:, 0:partitions], row)
