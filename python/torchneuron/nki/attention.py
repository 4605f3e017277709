"""Flash-style attention in tiles of 128: the kernels flash_attention(q, k,
v, causal=False) and flash_attention_lse (the same and the rows'
logsumexp, for the backward: attention_backward.py). attention_op.py makes
them torch operators.

q, k, v are [B, H, S, D] (D <= 128; any S), as for
torch.nn.functional.scaled_dot_product_attention with the default scale
1/sqrt(D). For each (b, h) and each tile of 128 query rows the kernel keeps
the running row maximum m, the running sum l and the unnormalised output
acc in SBUF, and walks the key/value tiles (with `causal`, only those at or
before the query tile, the diagonal one masked):

    s     = q_tile @ k_block.T                tensor engine, PSUM [128, 512]
    m'    = max(m, rowmax(s))                 vector engine
    p, r  = exp(scale * s - scale * m'),      scalar engine: one activation_reduce
            rowsum(p)
    alpha = exp(scale * m - scale * m')       scalar engine
    l     = l * alpha + r                     vector engine (scalar_tensor_tensor)
    acc   = acc * alpha + p @ v_block         tensor engine, p transposed per 128
                                              keys (copies on the gpsimd engine)

and writes acc / l. Key blocks are 512 positions, the tensor engine's
largest moving tile ([128, 512] float32 scores fill one PSUM bank): fewer,
longer instructions amortise each engine's fixed overhead. q and k tiles
are transposed on the tensor engine once per (b, h) so the contraction (D,
then the key positions) runs over the partitions. The
score matrix never reaches HBM: the kernel moves q, k, v and the output
only, where eager attention writes and reads the [S, S] scores and
probabilities.
"""

import math
from types import SimpleNamespace

import torch

from . import isa as nisa
from . import language as nl
from .kernel import jit


def attention_reference(q, k, v, causal=False):
    """torch's scaled_dot_product_attention in float32, in q's dtype."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal)
    return out.to(q.dtype)


def attention_lse_reference(q, k, v, causal=False):
    """(attention_reference, the rows' logsumexp of the scaled, masked
    scores [B, H, S] float32)."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, -math.inf)
    return attention_reference(q, k, v, causal), torch.logsumexp(scores, dim=-1)


@jit(reference=attention_reference)
def flash_attention(q, k, v, causal=False):
    return _attention(q, k, v, causal, lse=None)


@jit(reference=attention_lse_reference)
def flash_attention_lse(q, k, v, causal=False):
    """flash_attention and the rows' logsumexp (what the backward needs)."""
    lse = nl.ndarray(q.shape[:3], dtype=nl.float32, buffer=nl.shared_hbm)
    return _attention(q, k, v, causal, lse=lse), lse


def _attention(q, k, v, causal, lse):
    batch, heads, seq, dim = q.shape
    out = nl.ndarray(q.shape, dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / math.sqrt(dim)
    for b in nl.affine_range(batch):
        for h in nl.affine_range(heads):
            k_blocks = _key_blocks(load_tiles(k[b, h]), dim, q.dtype)
            v_tiles = load_tiles(v[b, h])                             # [128, D] each
            q_tiles = load_tiles(q[b, h])
            outs = []
            for g in nl.affine_range(0, len(q_tiles), GROUP):
                group = [SimpleNamespace(q_t=nl.copy(nl.transpose(t), engine="gpsimd"),
                                         rows=slice(i * 128, i * 128 + t.shape[0]))
                         for i, t in enumerate(q_tiles[g:g + GROUP], start=g)]
                outs += _query_tiles(group, k_blocks, v_tiles, scale, causal, q.dtype,
                                     want_lse=lse is not None)
                for st in group if lse is not None else ():
                    nl.store(lse[b, h][st.rows].reshape(-1, 1), value=st.lse)
            store_rows(out[b, h], outs)
    return out


GROUP = 4  # query tiles whose instructions interleave, so the engines overlap


def store_rows(view, tiles):
    """The output tiles [128, D] into the HBM [S, D] view: one DMA of the
    [128, S / 128, D] layout when S is a multiple of 128, else one per tile."""
    seq, dim = view.shape
    if seq % 128 or len(tiles) == 1:
        for i, t in enumerate(tiles):
            nl.store(view[i * 128:i * 128 + t.shape[0], :], value=t)
        return
    whole = nl.ndarray((128, len(tiles), dim), dtype=tiles[0].dtype)
    for i, t in enumerate(tiles):
        whole[:, i, :] = t
    nl.store(view.reshape(len(tiles), 128, dim).permute(1, 0, 2), value=whole)


def load_tiles(view):
    """An HBM [S, D] view as SBUF tiles of 128 rows [128, D]: one DMA of the
    [128, S / 128, D] layout when S is a multiple of 128 (bigger transfers
    use the DMA engines better), else one DMA per tile."""
    seq, dim = view.shape
    if seq % 128 == 0:
        whole = nl.load(view.reshape(seq // 128, 128, dim).permute(1, 0, 2))
        return [whole[:, j, :] for j in range(seq // 128)]
    return [nl.load(view[i:i + 128, :]) for i in range(0, seq, 128)]


def _key_blocks(k_tiles, dim, dtype):
    """Keys as the tensor engine's moving operand: blocks of up to 512
    positions (its largest moving tile), each an SBUF [D, <=512] tile of
    transposed key tiles; returns [(first position, block)]."""
    blocks = []
    for first in range(0, len(k_tiles), BLOCK // 128):
        tiles = k_tiles[first:first + BLOCK // 128]
        width = builtins_sum(t.shape[0] for t in tiles)
        block = nl.ndarray((dim, width), dtype=dtype)
        for j, t in enumerate(tiles):
            block[:, j * 128:j * 128 + t.shape[0]] = nl.transpose(t)
        blocks.append((first * 128, block))
    return blocks


BLOCK = 512  # key positions per score tile: [128, 512] float32 is one PSUM bank
builtins_sum = sum


def _query_tiles(group, k_blocks, v_tiles, scale, causal, dtype, want_lse=False):
    """Tiles of query rows (each q_t: [D, n], rows) against the key blocks,
    their instructions interleaved stage by stage; returns the output tiles
    [n, D] (and sets each one's lse [n, 1] when `want_lse`)."""
    for st in group:
        n, dim = st.q_t.shape[1], st.q_t.shape[0]
        st.m = nl.full((n, 1), -math.inf, dtype=nl.float32)
        st.l = nl.zeros((n, 1), dtype=nl.float32)
        st.acc = nl.zeros((n, dim), dtype=nl.float32)
    for start, k_block in k_blocks:
        live = [st for st in group if not (causal and start >= st.rows.stop)]
        for st in live:
            st.s = nisa.nc_matmul(st.q_t, k_block)                  # PSUM [n, <=512]
            if causal and start + k_block.shape[1] > st.rows.start:
                st.s = nisa.affine_select(st.s, -math.inf, offset=st.rows.start - start)
        for st in live:
            st.m_new = nl.maximum(st.m, nl.max(st.s, axis=1))
            st.bias = nl.multiply(st.m_new, -scale)
        for st in live:
            st.rowsum = nl.ndarray((st.s.shape[0], 1), dtype=nl.float32)
            st.p = nisa.activation_reduce(nl.exp, st.s, reduce_op=nl.add,
                                          reduce_res=st.rowsum, bias=st.bias, scale=scale,
                                          dtype=dtype)
            st.alpha = nisa.activation(nl.exp, st.m, bias=st.bias, scale=scale)
            st.s = None                                             # frees its PSUM bank
        for st in live:
            st.l = nisa.scalar_tensor_tensor(st.l, nl.multiply, st.alpha, nl.add, st.rowsum)
            st.pv = _probabilities_times_values(st.p, v_tiles, start)
        for st in live:
            st.acc = nisa.scalar_tensor_tensor(st.acc, nl.multiply, st.alpha, nl.add, st.pv)
            st.m, st.p, st.pv = st.m_new, None, None
    for st in group if want_lse else ():  # logsumexp = scale * m + log(l)
        st.lse = nisa.scalar_tensor_tensor(st.m, nl.multiply, scale, nl.add,
                                           nl.log(st.l))
    return [nl.divide(st.acc, st.l, dtype=dtype) for st in group]


def _probabilities_times_values(p, v_tiles, start):
    """p [n, <=512] @ the values of those key positions: per 128 keys, p's
    block transposed (tensor engine, copied to SBUF on the gpsimd and scalar
    engines in turn) times the value tile, accumulated in PSUM (the first
    matmul writes the unwritten accumulator)."""
    pv = nl.ndarray((p.shape[0], v_tiles[0].shape[1]), dtype=nl.float32, buffer=nl.psum)
    for j in range(0, p.shape[1], 128):
        v_tile = v_tiles[(start + j) // 128]
        engine = ("gpsimd", "scalar")[(j // 128) % 2]
        p_t = nl.copy(nl.transpose(p[:, j:j + v_tile.shape[0]]), engine=engine)
        pv += nisa.nc_matmul(p_t, v_tile)
    return pv
