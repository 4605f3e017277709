"""Flash-style attention in tiles of 128, as a kernel and as the operator
torch.ops.nki.flash_attention(q, k, v, causal=False).

q, k, v are [B, H, S, D] (D <= 128; any S), as for
torch.nn.functional.scaled_dot_product_attention with the default scale
1/sqrt(D). For each (b, h) and each tile of 128 query rows the kernel keeps
the running row maximum m, the running sum l and the unnormalised output
acc in SBUF, and walks the key/value tiles (with `causal`, only those at or
before the query tile, the diagonal one masked):

    s     = q_tile @ k_tile.T                 tensor engine, PSUM [128, 128]
    m'    = max(m, rowmax(s))                 vector engine
    p     = exp(scale * s - scale * m')       scalar engine (one activation)
    alpha = exp(scale * m - scale * m')       scalar engine
    l     = l * alpha + rowsum(p)             vector engine
    acc   = acc * alpha + p @ v_tile          tensor engine (p transposed first)

and writes acc / l. q and k tiles are transposed on the tensor engine so
the contraction (D, then the key positions) runs over the partitions. The
score matrix never reaches HBM: the kernel moves q, k, v and the output
only, where eager attention writes and reads the [S, S] scores and
probabilities.

Autograd: the backward recomputes attention with eager operations on the
inputs' device (a backward kernel is not written yet, docs/nki.md).
"""

import math

import torch

from . import isa as nisa
from . import language as nl
from .kernel import jit
from .op import as_op


def attention_reference(q, k, v, causal=False):
    """torch's scaled_dot_product_attention in float32, in q's dtype."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal)
    return out.to(q.dtype)


@jit(reference=attention_reference)
def flash_attention(q, k, v, causal=False):
    batch, heads, seq, dim = q.shape
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / math.sqrt(dim)
    for b in nl.affine_range(batch):
        for h in nl.affine_range(heads):
            k_t = [nl.copy(nl.transpose(t)) for t in _load_tiles(k[b, h])]  # [D, 128] each
            v_tiles = _load_tiles(v[b, h])                                    # [128, D] each
            for i, q_tile in enumerate(_load_tiles(q[b, h])):
                rows = slice(i * 128, i * 128 + q_tile.shape[0])
                o = _query_tile(nl.copy(nl.transpose(q_tile)), k_t, v_tiles, rows, scale,
                                causal, q.dtype)
                nl.store(out[b, h][rows, :], value=o)
    return out


def _load_tiles(view):
    """An HBM [S, D] view as SBUF tiles of 128 rows [128, D]: one DMA of the
    [128, S / 128, D] layout when S is a multiple of 128 (bigger transfers
    use the DMA engines better), else one DMA per tile."""
    seq, dim = view.shape
    if seq % 128 == 0:
        whole = nl.load(view.reshape(seq // 128, 128, dim).permute(1, 0, 2))
        return [whole[:, j, :] for j in range(seq // 128)]
    return [nl.load(view[i:i + 128, :]) for i in range(0, seq, 128)]


def _query_tile(q_t, k_t, v_tiles, rows, scale, causal, dtype):
    """One tile of query rows (q_t: [D, n]) against the key/value tiles;
    returns the output tile [n, D]."""
    n, dim = q_t.shape[1], q_t.shape[0]
    m = nl.full((n, 1), -math.inf, dtype=nl.float32)
    l = nl.zeros((n, 1), dtype=nl.float32)
    acc = nl.zeros((n, dim), dtype=nl.float32)
    for j in nl.sequential_range(len(k_t)):
        start = j * 128
        if causal and start >= rows.stop:
            break
        s = nisa.nc_matmul(q_t, k_t[j])                      # PSUM [n, kn]
        if causal and start + k_t[j].shape[1] > rows.start:
            s = nisa.affine_select(s, -math.inf, offset=rows.start - start)
        m_new = nl.maximum(m, nl.max(s, axis=1))
        bias = nl.multiply(m_new, -scale)
        p = nisa.activation(nl.exp, s, bias=bias, scale=scale, dtype=dtype)
        alpha = nisa.activation(nl.exp, m, bias=bias, scale=scale)
        l = nl.add(nl.multiply(l, alpha), nl.sum(p, axis=1, dtype=nl.float32))
        pv = nisa.nc_matmul(nl.copy(nl.transpose(p)), v_tiles[j])   # PSUM [n, D]
        acc = nl.add(nl.multiply(acc, alpha), pv)
        m = m_new
    return nl.divide(acc, l, dtype=dtype)


def _setup_context(ctx, inputs, output):
    q, k, v, causal = inputs
    ctx.save_for_backward(q, k, v)
    ctx.causal = causal


def _backward(ctx, grad):
    q, k, v = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=ctx.causal)
        dq, dk, dv = torch.autograd.grad(out, leaves, grad)
    return dq, dk, dv, None


flash_attention_op = as_op(flash_attention, "nki::flash_attention",
                           schema="(Tensor q, Tensor k, Tensor v, bool causal=False) -> Tensor",
                           backward=_backward, setup_context=_setup_context)
