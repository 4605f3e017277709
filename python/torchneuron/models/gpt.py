"""A small GPT (token and position embeddings, pre-LayerNorm transformer
blocks, LM head) built from torchneuron.parallel's tensor-parallel layers.

With a tensor-parallel group of t ranks, attention heads, MLP columns and
the vocabulary are split t ways (the vocabulary padded to a multiple of t)
and the loss is the vocab-parallel cross-entropy; with t = 1 (group False,
or torchneuron.parallel not initialized) the same code is an ordinary
single-device model. Built from the same seed, both start from the same
weights. Activations are [sequence, batch, hidden]; sequence_parallel
splits them along the sequence outside the tensor-parallel regions.

    model = GPT(GPTConfig(vocab_size=256, seq_len=64, dim=128, heads=4, layers=2))
    loss = model(tokens, targets)          # tokens, targets: int64 [batch, seq]
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..parallel import tensor_parallel as tp


@dataclasses.dataclass
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.0  # on the residual branches (outside tensor-parallel regions)
    attention_dropout: float = None  # on the attention probabilities; None: `dropout`

    def __post_init__(self):
        if self.attention_dropout is None:
            self.attention_dropout = self.dropout

    def parameters(self):
        """Parameter count (unpadded vocabulary)."""
        d, v = self.dim, self.vocab_size
        block = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * self.mlp_ratio * d * d \
            + self.mlp_ratio * d + d
        return v * d + self.seq_len * d + self.layers * block + 2 * d + v * d


def _layer_norm(dim, sequence_parallel, group=None):
    ln = nn.LayerNorm(dim)
    if sequence_parallel:
        tp.mark_sequence_parallel(ln.weight, group)
        tp.mark_sequence_parallel(ln.bias, group)
    return ln


class Attention(nn.Module):
    def __init__(self, cfg, group, sequence_parallel):
        super().__init__()
        t = tp._size_rank(tp._group(group))[0]
        if cfg.heads % t:
            raise ValueError(f"GPT: the tensor-parallel size {t} does not divide the "
                             f"{cfg.heads} attention heads")
        if cfg.dim % cfg.heads:
            raise ValueError(f"GPT: {cfg.heads} heads do not divide the hidden size {cfg.dim}")
        self.heads, self.head_dim = cfg.heads // t, cfg.dim // cfg.heads
        self.tp_size = t
        self.dropout = cfg.attention_dropout
        # Output features per head: (q, k, v) x head_dim, so a column split keeps heads whole.
        self.qkv = tp.ColumnParallelLinear(cfg.dim, 3 * cfg.dim, group=group,
                                           sequence_parallel=sequence_parallel)
        self.proj = tp.RowParallelLinear(cfg.dim, cfg.dim, group=group,
                                         sequence_parallel=sequence_parallel)
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        qkv = self.qkv(x)  # [s, b, heads * 3 * head_dim] (this rank's heads)
        s, b, _ = qkv.shape
        q, k, v = qkv.view(s, b, self.heads, 3, self.head_dim).permute(3, 1, 2, 0, 4).unbind(0)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)  # [b, heads, s, s]
        att = att.masked_fill(self.mask[:s, :s], float("-inf")).softmax(-1)
        if self.dropout and self.training and self.tp_size == 1 and \
                torch.compiler.is_compiling():
            # One rank has every head: the compiled graph draws the mask from
            # the seed it takes each run (torch's default generator).
            att = F.dropout(att, self.dropout)
        elif self.dropout and self.training:  # this rank's heads: its own stream
            att = tp.tensor_parallel_dropout(att, self.dropout)
        y = (att @ v).permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg, group, sequence_parallel):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.dim
        self.fc1 = tp.ColumnParallelLinear(cfg.dim, hidden, group=group,
                                           sequence_parallel=sequence_parallel)
        self.fc2 = tp.RowParallelLinear(hidden, cfg.dim, group=group,
                                        sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg, group=None, sequence_parallel=False):
        super().__init__()
        self.ln1 = _layer_norm(cfg.dim, sequence_parallel, group)
        self.attn = Attention(cfg, group, sequence_parallel)
        self.ln2 = _layer_norm(cfg.dim, sequence_parallel, group)
        self.mlp = MLP(cfg, group, sequence_parallel)
        self.dropout = cfg.dropout
        self.group = group if sequence_parallel else False  # False: plain dropout

    def drop(self, x):
        """Residual dropout; on a sequence shard, the one-device model's mask."""
        return tp.sequence_parallel_dropout(x, self.dropout, self.training, self.group)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Embedding(nn.Module):
    """Token + position embeddings: int64 [batch, seq] -> [seq(/t), batch, dim]."""

    def __init__(self, cfg, group=None, sequence_parallel=False):
        super().__init__()
        self.group = tp._group(group)
        self.sequence_parallel = sequence_parallel
        self.tokens = tp.VocabParallelEmbedding(cfg.vocab_size, cfg.dim, group=group,
                                                sequence_parallel=sequence_parallel)
        self.positions = nn.Embedding(cfg.seq_len, cfg.dim)
        if sequence_parallel:
            tp.mark_sequence_parallel(self.positions.weight, group)

    def forward(self, tokens):
        s = tokens.shape[1]
        x = self.tokens(tokens.t())  # [s(/t), b, dim]
        positions = torch.arange(s)
        if self.sequence_parallel:
            t, rank = tp._size_rank(self.group)
            positions = positions[rank * (s // t):(rank + 1) * (s // t)]
        return x + self.positions(positions).unsqueeze(1)


class Head(nn.Module):
    """Final LayerNorm and LM head: -> logits [seq, batch, vocab(/t, padded)]."""

    def __init__(self, cfg, group=None, sequence_parallel=False):
        super().__init__()
        self.ln = _layer_norm(cfg.dim, sequence_parallel, group)
        self.out = tp.ColumnParallelLinear(cfg.dim, cfg.vocab_size, bias=False, group=group,
                                           sequence_parallel=sequence_parallel, pad_output=True)

    def forward(self, x):
        return self.out(self.ln(x))


class GPT(nn.Module):
    """tp_group: the tensor-parallel group (None: torchneuron.parallel's if
    initialized; False: none). forward(tokens[, targets]) returns logits
    [seq, batch, vocab(/t)], or the mean cross-entropy given targets."""

    def __init__(self, cfg, tp_group=None, sequence_parallel=False):
        super().__init__()
        self.cfg, self.group = cfg, tp._group(tp_group)
        if sequence_parallel and cfg.seq_len % tp._size_rank(self.group)[0]:
            raise ValueError(f"GPT: sequence parallelism needs the tensor-parallel size to "
                             f"divide the sequence length {cfg.seq_len}")
        group = self.group
        self.embed = Embedding(cfg, group, sequence_parallel)
        self.blocks = nn.ModuleList(Block(cfg, group, sequence_parallel)
                                    for _ in range(cfg.layers))
        self.head = Head(cfg, group, sequence_parallel)

    def stages(self):
        """The model as a flat sequence of layers, for pipeline partitioning."""
        return [self.embed, *self.blocks, self.head]

    def loss(self, logits, targets):
        return tp.vocab_parallel_cross_entropy(logits, targets.t(), self.cfg.vocab_size,
                                               self.group).mean()

    def forward(self, tokens, targets=None):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(x)
        return logits if targets is None else self.loss(logits, targets)
