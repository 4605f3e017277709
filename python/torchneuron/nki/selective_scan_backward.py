"""The selective scan's backward kernel: selective_scan_backward(x, delta, A,
B, C, dy) -> (dx, ddelta, dA, dB, dC), the gradients of
selective_scan.selective_scan's y (shapes there) given dy = dL/dy.

With a_t = exp(-A delta_t), u_t = delta_t x_t and h the forward's states,
the states' gradient runs backward in time,

    g_t[d, n] = a_{t+1}[d] g_{t+1}[d, n] + dy_t[d] C_t[n]      (g after T: 0)

and then

    dC_t[n] = sum_d dy_t[d] h_t[d, n]      dB_t[n] = sum_d g_t[d, n] u_t[d]
    du_t    = sum_n g_t[n] B_t[n]          da_t a_t = sum_n g_t[n] h_t[n] - u_t du_t
    dx = du delta     ddelta = du x - A (da a)     dA = -sum_{b, t} delta (da a)

(da_t a_t = sum_n g_t h_{t-1} a_t, and a_t h_{t-1} = h_t - u_t B_t: no
division by a decay, no shifted h.)

Tiles: 128 channels on the partitions and chunks of 128 time steps in the
free dimension, the chunks taken from the last. A first pass runs the
forward's scans (selective_scan.state_scan) to keep each chunk's starting
state h (a [channels, state] tile per chunk); the second recomputes h per
chunk from it. g's scan runs on the vector engine with time reversed:
dy and C_t (broadcast over the channels) are read reversed by the tensor
engine, as matmuls with the exchange matrix J (J[k, j] = 1 where k + j =
L - 1: a [time, channels] tile times J is the [channels, time reversed]
tile), and g is turned back by a transpose and J. The sums over channels
(dB, dC) are matmuls with a ones column, accumulated in PSUM over the
channel tiles; the sums over states accumulate on the vector engine.
"""

from types import SimpleNamespace

import torch

from . import isa as nisa
from . import language as nl
from .kernel import jit
from .selective_scan import chunk_inputs, selective_scan_reference, state_rows, state_scan

CHUNK = 128  # time steps: the exchange matrix's contraction is over the partitions


def selective_scan_backward_reference(x, delta, A, B, C, dy):
    """Autograd through selective_scan_reference (float64), each gradient
    in its input's dtype."""
    inputs = [t.detach().double().requires_grad_() for t in (x, delta, A, B, C)]
    y = selective_scan_reference(*inputs)
    grads = torch.autograd.grad(y, inputs, dy.double())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (x, delta, A, B, C)))


@jit(reference=selective_scan_backward_reference)
def selective_scan_backward(x, delta, A, B, C, dy):
    batch, seq, inner = x.shape
    out = SimpleNamespace(dx=_hbm(x), ddelta=_hbm(delta), dA=_hbm(A), dB=_hbm(B), dC=_hbm(C))
    k = _constants(B.shape[2])
    tiles = [SimpleNamespace(channels=slice(c0, min(inner, c0 + nl.tile_size.pmax)))
             for c0 in range(0, inner, nl.tile_size.pmax)]
    for t in tiles:
        a = nl.load(A[t.channels].reshape(-1, 1))
        t.neg_a = nl.multiply(a, -1.0, dtype=nl.float32)
        t.dA = nl.zeros((a.shape[0], 1), dtype=nl.float32)
    chunks = [slice(t0, min(seq, t0 + CHUNK)) for t0 in range(0, seq, CHUNK)]
    for b in nl.affine_range(batch):
        starts = _chunk_starts(x, delta, B, b, tiles, chunks, k)
        for t in tiles:
            t.g = None
        for i in reversed(range(len(chunks))):
            _chunk(x, delta, B, C, dy, out, b, chunks[i], tiles, starts[i], k)
    for t in tiles:
        nl.store(out.dA[t.channels].reshape(-1, 1), value=nl.copy(t.dA, dtype=A.dtype))
    return out.dx, out.ddelta, out.dA, out.dB, out.dC


def _hbm(like):
    return nl.ndarray(like.shape, dtype=like.dtype, buffer=nl.shared_hbm)


def _constants(state):
    """The kernel's constant tiles (float32): ones as the broadcasts' and
    sums' operands, the exchange matrices per chunk length (made on the
    gpsimd engine: two affine_selects of a ones tile)."""
    p = nl.tile_size.pmax
    k = SimpleNamespace(state=state, ones_row=nl.full((1, p), 1.0, dtype=nl.float32),
                        ones_col=nl.full((p, 1), 1.0, dtype=nl.float32),
                        ones=nl.full((CHUNK, p), 1.0, dtype=nl.float32), exchange={})
    return k


def _exchange(k, length):
    """J [length, length]: 1 where row + column = length - 1."""
    if length not in k.exchange:
        ones = nl.full((length, length), 1.0, dtype=nl.float32)
        upper = nisa.affine_select(ones, 0.0, partition_step=1, free_step=1,
                                   offset=-(length - 1))
        k.exchange[length] = nisa.affine_select(upper, 0.0, partition_step=-1, free_step=-1,
                                                offset=length - 1)
    return k.exchange[length]


def _chunk_starts(x, delta, B, b, tiles, chunks, k):
    """The forward's scans over batch b: starts[i][j] is channel tile j's
    state h [channels, state] before chunk i (None for the first)."""
    starts = [[None] * len(tiles)]
    for i, times in enumerate(chunks[:-1]):
        b_rows = state_rows(B, b, times, k.state)
        row = []
        for j, t in enumerate(tiles):
            rows = (b, times, t.channels)
            decay, u, _, _ = chunk_inputs(x[rows].permute(1, 0), delta[rows].permute(1, 0),
                                          t.neg_a)
            last = nl.ndarray((decay.shape[0], k.state), dtype=nl.float32)
            for n in nl.static_range(k.state):
                state_scan(decay, u, b_rows, n, k.ones_row, starts[i][j], last)
            row.append(last)
        starts.append(row)
    return starts


def _chunk(x, delta, B, C, dy, out, b, times, tiles, starts, k):
    """One chunk (batch b, `times`) over the channel tiles: dx, ddelta
    stored, dA accumulated per tile, dB and dC summed over the tiles in
    PSUM and stored."""
    length = times.stop - times.start
    seq = x.shape[1]
    c = SimpleNamespace(length=length, J=_exchange(k, length),
                        b_rows=state_rows(B, b, times, k.state),
                        dB=nl.ndarray((length, k.state), dtype=nl.float32, buffer=nl.psum),
                        dC=nl.ndarray((length, k.state), dtype=nl.float32, buffer=nl.psum))
    c_nat = nl.load(C[b, times, :])                                  # [time, state]
    # Per state, C reversed in time as a matmul operand: J scaled by C's column.
    c.c_rev = [nisa.activation(None, c.J, scale=c_nat[:, n:n + 1], dtype=nl.float32)
               for n in range(k.state)]
    shifted = slice(times.start + 1, min(seq, times.stop + 1))      # a_{t+1}'s deltas
    for j, t in enumerate(tiles):
        rows = (b, times, t.channels)
        t.shifted = (nl.load(delta[b, shifted, t.channels])
                     if shifted.stop > shifted.start else None)
        t.g = _tile_chunk(x[rows], delta[rows], dy[rows], t, starts[j], c, k,
                          (out.dx[rows].permute(1, 0), out.ddelta[rows].permute(1, 0)))
    for name, acc in (("dB", c.dB), ("dC", c.dC)):
        target = getattr(out, name)
        nl.store(target[b, times, :], value=nl.copy(acc, dtype=target.dtype, engine="scalar"))


def _reversed(k, c, natural, rows=None):
    """A [time, channels] tile as [channels, time reversed] (PSUM, float32):
    natural.T @ J on the tensor engine; `rows` of J when natural has fewer."""
    j = c.J if rows is None else c.J[0:rows, :]
    return nisa.nc_matmul(nl.copy(natural, dtype=nl.float32, engine="scalar")
                          if natural.dtype != nl.float32 else natural, j)


def _tile_chunk(x, delta, dy, t, start, c, k, stores):
    """One channel tile of one chunk (x, delta, dy HBM [time, channels]
    views): returns g's carry [channels, state] (g at the chunk's first
    step) for the chunk before."""
    channels = x.shape[1]
    decay, u, delta_t, x_t = chunk_inputs(x.permute(1, 0), delta.permute(1, 0), t.neg_a)
    dy_f = nl.load(dy.permute(1, 0))                               # [channels, time]
    dy_rev = nl.copy(_reversed(k, c, nl.load(dy)), engine="scalar")
    if t.shifted is None:  # the last step alone: g starts at 0, its decay unused
        decay_rev = nl.full((channels, c.length), 1.0, dtype=nl.float32)
    else:
        decay_rev = nisa.activation(nl.exp, _reversed(k, c, t.shifted, t.shifted.shape[0]),
                                    scale=t.neg_a, dtype=nl.float32)
    acc = SimpleNamespace(du=None, gh=None, ones_col=k.ones_col[0:channels, :],
                          carry=nl.ndarray((channels, k.state), dtype=nl.float32))
    for n in nl.static_range(k.state):
        _state(n, decay, u, dy_f, dy_rev, decay_rev, t, start, c, k, acc)
    _inputs_gradients(x_t, delta_t, u, acc, t, stores)
    return acc.carry


def _state(n, decay, u, dy_f, dy_rev, decay_rev, t, start, c, k, acc):
    """State n of one channel tile's chunk: h recomputed, g scanned in
    reversed time and turned back; dB, dC, du and sum_n g h accumulated."""
    channels, length = decay.shape
    h, b_n = state_scan(decay, u, c.b_rows, n, k.ones_row, start, None)
    c_rev = nisa.nc_matmul(k.ones[0:length, 0:channels], c.c_rev[n])   # C_n reversed, broadcast
    e_rev = nisa.tensor_tensor(dy_rev, c_rev, nl.multiply, dtype=nl.float32, engine="gpsimd")
    initial = 0.0 if t.g is None else t.g[:, n:n + 1]
    g_rev = nisa.tensor_tensor_scan(decay_rev, e_rev, initial, nl.multiply, nl.add)
    nl.copy_into(acc.carry[:, n:n + 1], g_rev[:, length - 1:length], engine="scalar")
    g = nisa.nc_matmul(nl.copy(nisa.nc_transpose(g_rev), engine="scalar"), c.J)
    dB = c.dB[:, n:n + 1]
    dB += nisa.nc_matmul(nisa.tensor_tensor(g, u, nl.multiply, dtype=nl.float32,
                                            engine="gpsimd"), acc.ones_col)
    dC = c.dC[:, n:n + 1]
    dC += nisa.nc_matmul(nisa.tensor_tensor(dy_f, h, nl.multiply, dtype=nl.float32),
                         acc.ones_col)
    gb = nisa.tensor_tensor(g, b_n, nl.multiply, dtype=nl.float32, engine="gpsimd")
    gh = nisa.tensor_tensor(g, h, nl.multiply, dtype=nl.float32, engine="gpsimd")
    acc.du = gb if acc.du is None else nl.add(acc.du, gb)
    acc.gh = gh if acc.gh is None else nl.add(acc.gh, gh)


def _inputs_gradients(x_t, delta_t, u, acc, t, stores):
    """dx = du delta, ddelta = du x - A (da a), dA += -sum_t delta (da a),
    with da a = sum_n g h - u du (x_t, delta_t, u tiles [channels, time];
    stores the HBM views of dx and ddelta)."""
    dx_out, ddelta_out = stores
    da_a = nl.subtract(acc.gh, nl.multiply(u, acc.du))
    nl.store(dx_out, value=nl.multiply(acc.du, delta_t, dtype=dx_out.dtype))
    ddelta = nisa.scalar_tensor_tensor(da_a, nl.multiply, t.neg_a, nl.add,
                                       nl.multiply(acc.du, x_t), dtype=ddelta_out.dtype)
    nl.store(ddelta_out, value=ddelta)
    t.dA = nisa.scalar_tensor_tensor(nl.sum(nl.multiply(da_a, delta_t), axis=1),
                                     nl.multiply, -1.0, nl.add, t.dA)
