"""The flash attention backward kernel, in tiles of 128.

flash_attention_backward(q, k, v, out, dout, lse, causal) -> (dq, dk, dv),
q, k, v, out, dout [B, H, S, D], lse [B, H, S] float32 (the forward's
logsumexp: flash_attention_lse). For each (b, h): Di = rowsum(dout * out)
per query tile; then for each key tile j (128 positions), over the query
tiles i at or after it when causal:

    s   = q_i @ k_j.T                          tensor engine, PSUM [128q, 128k]
    p   = exp(scale * s - lse_i)               scalar engine (the forward's probabilities)
    dv_j += p.T @ dout_i                       tensor engine, PSUM
    dp  = dout_i @ v_j.T                       tensor engine, PSUM
    ds  = (dp - Di) * p                        vector engine (scalar_tensor_tensor)
    dk_j += ds.T @ q_i                         tensor engine, PSUM (scaled at the end)
    dq_i += ds @ k_j                           tensor engine (ds transposed), PSUM

dq's accumulators stay in PSUM across the key tiles: S / 128 tiles of
[128, D] float32 (the PSUM capacity rule bounds S: 16 KiB per partition).
"""

import math

import torch

from . import isa as nisa
from . import language as nl
from .attention import load_tiles, store_rows
from .kernel import jit


def attention_backward_reference(q, k, v, out, dout, lse, causal=False):
    """torch autograd through scaled_dot_product_attention in float32."""
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        grads = torch.autograd.grad(o, leaves, dout.float())
    return tuple(g.to(q.dtype) for g in grads)


@jit(reference=attention_backward_reference)
def flash_attention_backward(q, k, v, out, dout, lse, causal=False):
    batch, heads, seq, dim = q.shape
    grads = [nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm) for _ in range(3)]
    for b in nl.affine_range(batch):
        for h in nl.affine_range(heads):
            dq, dk, dv = _head(q[b, h], k[b, h], v[b, h], out[b, h], dout[b, h], lse[b, h],
                               causal)
            for hbm, tiles in zip(grads, (dq, dk, dv)):
                store_rows(hbm[b, h], tiles)
    return tuple(grads)


def _transposed(tile):
    return nl.copy(nl.transpose(tile), engine="gpsimd")


def _head(q, k, v, out, dout, lse, causal):
    """One (b, h): the gradients' tiles [128, D] (dq, dk, dv)."""
    dim = q.shape[1]
    scale = 1.0 / math.sqrt(dim)
    q_tiles, k_tiles, v_tiles = load_tiles(q), load_tiles(k), load_tiles(v)
    do_tiles = load_tiles(dout)
    rows = [slice(i * 128, i * 128 + t.shape[0]) for i, t in enumerate(q_tiles)]
    q_t = [_transposed(t) for t in q_tiles]                       # [D, n]
    do_t = [_transposed(t) for t in do_tiles]                     # [D, n]
    neg_lse = [nl.multiply(nl.load(lse[r].reshape(-1, 1)), -1.0) for r in rows]
    d_rows = [nl.sum(nl.multiply(o, d), axis=1, dtype=nl.float32)  # rowsum(dout * out)
              for o, d in zip(load_tiles(out), do_tiles)]
    dq_acc = [nl.ndarray((t.shape[0], dim), dtype=nl.float32, buffer=nl.psum)
              for t in q_tiles]
    dk, dv = [], []
    for j, (k_tile, v_tile) in enumerate(zip(k_tiles, v_tiles)):
        k_t, v_t = _transposed(k_tile), _transposed(v_tile)       # [D, kn]
        dk_acc = nl.ndarray((k_tile.shape[0], dim), dtype=nl.float32, buffer=nl.psum)
        dv_acc = nl.ndarray((k_tile.shape[0], dim), dtype=nl.float32, buffer=nl.psum)
        for i in nl.affine_range(j if causal else 0, len(q_tiles)):
            s = nisa.nc_matmul(q_t[i], k_t)                           # [n, kn]
            if causal and i == j:
                s = nisa.affine_select(s, -math.inf)
            p = nisa.activation(nl.exp, s, bias=neg_lse[i], scale=scale, dtype=q_tiles[i].dtype)
            dv_acc += nisa.nc_matmul(p, do_tiles[i])
            dp = nisa.nc_matmul(do_t[i], v_t)                         # [n, kn]
            ds = nisa.scalar_tensor_tensor(dp, nl.subtract, d_rows[i], nl.multiply, p,
                                           dtype=q_tiles[i].dtype)
            dk_acc += nisa.nc_matmul(ds, q_tiles[i])
            dq_acc[i] += nisa.nc_matmul(_transposed(ds), k_tile)
        dk.append(nl.multiply(dk_acc, scale, dtype=k_tile.dtype))
        dv.append(nl.copy(dv_acc, dtype=v_tile.dtype))
    dq = [nl.multiply(acc, scale, dtype=t.dtype) for acc, t in zip(dq_acc, q_tiles)]
    return dq, dk, dv
