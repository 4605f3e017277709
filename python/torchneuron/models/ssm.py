"""A small Mamba-style selective-scan language model: token embedding,
pre-LayerNorm selective-scan blocks, LM head.

Each block: an input projection to the inner width (x and a gate z), a
causal depthwise convolution over time, SiLU, the input-dependent step
delta (sigmoid), input matrix B_t and output matrix C_t (of `state` each),
the selective scan, the skip D x, the gate SiLU(z) and the output
projection, added to the residual stream. The scan, per channel d with the
decay exp(-delta_t A_d):

    h_t = exp(-delta_t A) h_{t-1} + delta_t x_t B_t,      y_t = C_t . h_t

is computed in closed form (as Mamba-2's SSD does for a chunk): with L the
cumsum over time of the log-decays -delta A,

    y_t = sum_{s <= t} exp(L_t - L_s) (C_t . B_s) delta_s x_s,

a causal [T, T] weight per channel (masked to -inf above the diagonal
before the exp) applied with a batched matmul. Every op of the forward and
backward (cumsum and its flip/cumsum/flip gradient, exp, masked_fill, bmm,
the convolution as shifted slices) runs natively on "neuron", eager and
compiled with torch.compile(backend="neuron"). The decay per channel is a
scalar (Mamba-2's simplification of Mamba's per-state A).

    model = SSMLM(SSMConfig(vocab=64, seq=32))
    loss = model(tokens, targets)          # tokens, targets: int64 [batch, seq]
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class SSMConfig:
    vocab: int = 64
    seq: int = 32        # the longest sequence (the causal mask's size)
    dim: int = 32        # the residual stream
    inner: int = 64      # the scanned channels (Mamba's expand x dim)
    state: int = 8       # B_t and C_t
    conv: int = 4        # the causal convolution's width
    layers: int = 2


def silu(x):
    """x sigmoid(x), written out (the device runs sigmoid and mul)."""
    return x * torch.sigmoid(x)


def selective_scan(x, delta, A, B, C, mask):
    """y [batch, T, inner] of the scan above. x, delta: [batch, T, inner];
    A: [inner] (> 0); B, C: [batch, T, state]; mask: bool [>= T, >= T],
    True above the diagonal."""
    b, t, d = x.shape
    log_decay = -delta * A                                  # [b, t, d]
    L = torch.cumsum(log_decay, dim=1).transpose(1, 2)      # [b, d, t]
    square = (b, d, t, t)
    segment = L.unsqueeze(-1).expand(square) - L.unsqueeze(-2).expand(square)
    decay = torch.exp(segment.masked_fill(mask[:t, :t], float("-inf")))
    cb = torch.bmm(C, B.transpose(1, 2))                    # [b, t, s]: C_t . B_s
    weights = decay * cb.unsqueeze(1).expand(square)        # [b, d, t, s]
    u = (delta * x).transpose(1, 2).reshape(b * d, t, 1)    # [b d, s, 1]
    y = torch.bmm(weights.reshape(b * d, t, t), u)          # [b d, t, 1]
    return y.reshape(b, d, t).transpose(1, 2)


class SelectiveScanBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.norm = nn.LayerNorm(cfg.dim)
        self.in_proj = nn.Linear(cfg.dim, 2 * cfg.inner)
        self.conv_weight = nn.Parameter(torch.randn(cfg.conv, cfg.inner) / cfg.conv ** 0.5)
        self.conv_bias = nn.Parameter(torch.zeros(cfg.inner))
        self.delta_proj = nn.Linear(cfg.inner, cfg.inner)
        self.bc_proj = nn.Linear(cfg.inner, 2 * cfg.state, bias=False)
        # Decay rates spread over channels, exp(A_log) in [1, cfg.conv]: short
        # and longer memories, as Mamba's initialisation spreads them.
        self.A_log = nn.Parameter(torch.linspace(0.0, 1.4, cfg.inner))
        self.D = nn.Parameter(torch.ones(cfg.inner))
        self.out_proj = nn.Linear(cfg.inner, cfg.dim)

    def conv(self, x):
        """The causal depthwise convolution over time: x [b, t, inner],
        out_t = bias + sum_k w[k] x_{t - (K - 1) + k} (zeros before the start)."""
        b, t, d = x.shape
        k = self.cfg.conv
        padded = torch.cat([x.new_zeros(b, k - 1, d), x], dim=1)
        out = self.conv_bias + padded[:, 0:t] * self.conv_weight[0]
        for i in range(1, k):
            out = out + padded[:, i:i + t] * self.conv_weight[i]
        return out

    def forward(self, h, mask):
        # Slices, not chunk: the device runs slice (chunk is aten.split).
        xz = self.in_proj(self.norm(h))
        x = silu(self.conv(xz[..., :self.cfg.inner]))
        z = xz[..., self.cfg.inner:]
        delta = torch.sigmoid(self.delta_proj(x))
        bc = self.bc_proj(x)
        B, C = bc[..., :self.cfg.state], bc[..., self.cfg.state:]
        y = selective_scan(x, delta, torch.exp(self.A_log), B, C, mask)
        y = (y + x * self.D) * silu(z)
        return h + self.out_proj(y)


class SSMLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(SelectiveScanBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab)
        self.register_buffer(
            "mask", torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, tokens, targets):
        """The mean cross-entropy of the next-token logits against `targets`."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h, self.mask)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, self.cfg.vocab), targets.reshape(-1))
