"""A decoder-only transformer of the Llama and GPT-3 families, built from
torchneuron.parallel's tensor-parallel layers (Megatron-LM's split): the
model `neuronrun predict` captures at full size on the meta device and the
one a small job of the same family trains for real.

Llama: RMSNorm, SwiGLU MLP, rotary position embeddings, grouped-query
attention (kv_heads <= heads), untied embeddings. GPT-3: LayerNorm, GELU
MLP, learned positions. A DecoderConfig names which (activation, norm,
position). With a tensor-parallel group of t ranks the query heads, the MLP
columns and the vocabulary are split t ways; key/value heads are split
when t divides them and otherwise replicated so that each rank holds the
kv head its query heads use (Neuron's kv_replicator). With
sequence_parallel, activations outside the tensor-parallel regions are
split along the sequence ([sequence, batch, hidden], dim 0).

Attention: "flash" calls F.scaled_dot_product_attention (causal; one
kernel on the device, which recomputes the scores in its backward); "core"
computes softmax(QK^T / sqrt(d))V with its scores in memory, as Megatron-LM's
CoreAttention does.

Activation checkpointing: "none" keeps every activation; "full" keeps each
layer's input and recomputes the layer in backward; "selective" recomputes
the attention core (with "core" attention) and the MLP's activation
function, as NeuronX Distributed's selective checkpointing does;
recompute_mlp also recomputes the whole MLP (NxD's choice at sequence 8192).

Mixture of Experts (Mixtral): with `experts` > 0 every layer's MLP is
decoder_moe.MoEFeedForward, top_k of `experts` SwiGLU (or GELU) experts of
ffn_hidden each, with a capacity (capacity_factor, 0: 1.0), split over an
expert-parallel group (`ep_group`) and each expert over the tensor-parallel
group; "selective" checkpointing leaves it whole, recompute_mlp recomputes
it whole.

    cfg = DecoderConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=172, vocab=256)
    model = Decoder(cfg)
    loss = model(tokens, targets)      # tokens, targets: int64 [batch, seq]
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

from ..parallel import tensor_parallel as tp
from .decoder_moe import MoEFeedForward

CHECKPOINTING = ("none", "selective", "full")


@dataclasses.dataclass
class DecoderConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 4
    ffn_hidden: int = 172
    vocab: int = 256
    activation: str = "swiglu"  # "swiglu" | "gelu"
    norm: str = "rmsnorm"       # "rmsnorm" | "layernorm"
    position: str = "rotary"    # "rotary" | "learned"
    max_seq: int = 4096         # learned positions' table
    rope_theta: float = 10000.0
    experts: int = 0            # a Mixture of Experts' per layer (0: a dense MLP)
    top_k: int = 0              # experts per token
    capacity_factor: float = 0.0  # 0: 1.0

    def check(self, tp_size=1):
        """ValueError naming the field for a model this tensor-parallel size
        cannot split (the C++ predictor checks the same before capturing)."""
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"decoder: {name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"decoder: heads ({self.heads}) do not divide hidden ({self.hidden})")
        if self.heads % self.kv_heads:
            raise ValueError(f"decoder: kv_heads ({self.kv_heads}) do not divide heads "
                             f"({self.heads})")
        if self.heads % tp_size:
            raise ValueError(f"decoder: the tensor-parallel size {tp_size} does not divide "
                             f"the {self.heads} attention heads")
        if self.kv_heads % tp_size and tp_size % self.kv_heads:
            raise ValueError(f"decoder: kv_heads ({self.kv_heads}) and the tensor-parallel "
                             f"size {tp_size} must divide one another")
        if self.ffn_hidden % tp_size:
            raise ValueError(f"decoder: the tensor-parallel size {tp_size} does not divide "
                             f"ffn_hidden ({self.ffn_hidden})")
        if self.activation not in ("swiglu", "gelu"):
            raise ValueError(f"decoder: unknown activation {self.activation!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"decoder: unknown norm {self.norm!r}")
        if self.position not in ("rotary", "learned"):
            raise ValueError(f"decoder: unknown position embedding {self.position!r}")
        self._check_experts()

    def _check_experts(self):
        if self.experts == 0:
            if self.top_k or self.capacity_factor:
                raise ValueError("decoder: top_k and capacity_factor are a Mixture of "
                                 "Experts' (set experts too)")
            return
        if self.experts < 0:
            raise ValueError(f"decoder: experts must not be negative, got {self.experts}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"decoder: top_k ({self.top_k}) must be between 1 and experts "
                             f"({self.experts})")
        if not 0 <= self.capacity_factor <= 64:
            raise ValueError(f"decoder: capacity_factor must be between 0 (1.0) and 64, got "
                             f"{self.capacity_factor}")


def load_config(path):
    """A DecoderConfig from a model file (configs/models/*.textproto: the
    DecoderModel text proto, flat `field: value` lines; neuronrun predict
    reads the same files with protobuf). ValueError names the file and line
    of anything else."""
    ints = {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "max_seq",
            "experts", "top_k"}
    floats = {"rope_theta", "capacity_factor"}
    strings = {"activation", "norm", "position"}
    ignored = {"name", "tied_embeddings"}
    values = {}
    with open(path) as f:
        text = f.read(1 << 20)
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition(":"))
        if not sep or key not in ints | strings | ignored | floats:
            raise ValueError(f"{path}:{number}: expected one `field: value` of DecoderModel, "
                             f"got {line!r}")
        if key in ints:
            values[key] = int(value)
        elif key in strings:
            values[key] = value.strip('"')
        elif key in floats:
            values[key] = float(value)
    if values.get("max_seq", 0) == 0:
        values.pop("max_seq", None)
    return DecoderConfig(**values)


class RMSNorm(nn.Module):
    """Llama's RMSNorm, computed in float32 and returned in the input's dtype."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def _norm(cfg, sequence_parallel, group):
    norm = RMSNorm(cfg.hidden) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.hidden)
    if sequence_parallel:
        for p in norm.parameters():
            tp.mark_sequence_parallel(p, group)
    return norm


def _rotate(x, cos, sin):
    """Rotary embedding of x [s, b, heads, head_dim] (halves rotated)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg, group, sequence_parallel, selective, attention="flash"):
        super().__init__()
        t = tp._size_rank(tp._group(group))[0]
        self.head_dim = cfg.hidden // cfg.heads
        self.heads = cfg.heads // t
        # kv heads: split when t divides them, else each rank holds one copy.
        self.kv_heads = cfg.kv_heads // t if cfg.kv_heads % t == 0 else 1
        kv_full = self.kv_heads * t  # replicated kv heads count once per rank
        # One column-parallel weight for q, k and v (NxD's fused QKV: one
        # all-gather of the input); rank r's part holds its query heads, then
        # its key and value heads.
        bias = cfg.activation == "gelu"  # GPT-3 has biases, Llama none
        self.qkv = tp.ColumnParallelLinear(
            cfg.hidden, (cfg.heads + 2 * kv_full) * self.head_dim, bias=bias, group=group,
            sequence_parallel=sequence_parallel)
        self.o = tp.RowParallelLinear(cfg.heads * self.head_dim, cfg.hidden, bias=bias,
                                      group=group, sequence_parallel=sequence_parallel)
        self.rotary = cfg.position == "rotary"
        self.theta = cfg.rope_theta
        self.selective = selective and attention == "core"
        self.flash = attention == "flash"

    def _rope(self, s, dtype, device):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, device=device).float()
                                    / self.head_dim))
        angles = torch.outer(torch.arange(s, device=device).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)[:, None, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _core(self, q, k, v):
        # q [b, heads, s, d], k/v [b, kv_heads, s, d]: causal attention.
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=self.kv_heads != self.heads)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = q.shape[2]
        scores = (q @ k.transpose(-1, -2)) * (self.head_dim ** -0.5)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype)
        return probs @ v

    def forward(self, x):
        qkv = self.qkv(x)                      # [s, b, (heads + 2 kv_heads) * d]
        s, b, _ = qkv.shape
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim,
                             self.kv_heads * self.head_dim], dim=-1)
        q = q.view(s, b, self.heads, self.head_dim)
        k = k.view(s, b, self.kv_heads, self.head_dim)
        v = v.view(s, b, self.kv_heads, self.head_dim)
        if self.rotary:
            cos, sin = self._rope(s, q.dtype, q.device)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        if self.selective and self.training:
            y = checkpoint.checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        y = y.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
        return self.o(y)


class MLP(nn.Module):
    def __init__(self, cfg, group, sequence_parallel, selective=False, whole=False):
        super().__init__()
        self.selective, self.whole = selective, whole
        self.swiglu = cfg.activation == "swiglu"
        width = 2 * cfg.ffn_hidden if self.swiglu else cfg.ffn_hidden
        # SwiGLU's gate and up projections in one column-parallel weight,
        # interleaved per rank (each rank's part holds its gate and its up).
        self.up = tp.ColumnParallelLinear(cfg.hidden, width, bias=not self.swiglu,
                                          group=group, sequence_parallel=sequence_parallel)
        self.down = tp.RowParallelLinear(cfg.ffn_hidden, cfg.hidden, bias=not self.swiglu,
                                         group=group, sequence_parallel=sequence_parallel)

    def _activation(self, h):
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h)

    def _forward(self, x):
        h = self.up(x)
        if self.selective and self.training:
            h = checkpoint.checkpoint(self._activation, h, use_reentrant=False)
        else:
            h = self._activation(h)
        return self.down(h)

    def forward(self, x):
        if self.whole and self.training:
            return checkpoint.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Layer(nn.Module):
    def __init__(self, cfg, group=None, sequence_parallel=False, checkpointing="none",
                 recompute_mlp=False, attention="flash", ep_group=False):
        super().__init__()
        selective = checkpointing == "selective"
        self.norm1 = _norm(cfg, sequence_parallel, group)
        self.attn = Attention(cfg, group, sequence_parallel, selective, attention)
        self.norm2 = _norm(cfg, sequence_parallel, group)
        if cfg.experts:
            self.mlp = MoEFeedForward(cfg, group, ep_group)
        else:
            self.mlp = MLP(cfg, group, sequence_parallel, selective, selective and recompute_mlp)
        self.recompute_moe = cfg.experts > 0 and selective and recompute_mlp
        self.full_checkpoint = checkpointing == "full"

    def _mlp(self, x):
        if self.recompute_moe and self.training:
            return checkpoint.checkpoint(self.mlp, x, use_reentrant=False)
        return self.mlp(x)

    def _forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self._mlp(self.norm2(x))

    def forward(self, x):
        if self.full_checkpoint and self.training:
            return checkpoint.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Embedding(nn.Module):
    """Tokens [batch, seq] -> [seq(/t), batch, hidden]."""

    def __init__(self, cfg, group=None, sequence_parallel=False):
        super().__init__()
        self.group = tp._group(group)
        self.sequence_parallel = sequence_parallel
        self.tokens = tp.VocabParallelEmbedding(cfg.vocab, cfg.hidden, group=group,
                                                sequence_parallel=sequence_parallel)
        self.positions = None
        if cfg.position == "learned":
            self.positions = nn.Embedding(cfg.max_seq, cfg.hidden)
            if sequence_parallel:
                tp.mark_sequence_parallel(self.positions.weight, group)

    def forward(self, tokens):
        x = self.tokens(tokens.t())
        if self.positions is None:
            return x
        s = tokens.shape[1]
        positions = torch.arange(s, device=tokens.device)
        if self.sequence_parallel:
            t, rank = tp._size_rank(self.group)
            positions = positions[rank * (s // t):(rank + 1) * (s // t)]
        return x + self.positions(positions).unsqueeze(1).to(x.dtype)


class Head(nn.Module):
    """Final norm and LM head: -> logits [seq, batch, vocab(/t, padded)]."""

    def __init__(self, cfg, group=None, sequence_parallel=False):
        super().__init__()
        self.norm = _norm(cfg, sequence_parallel, group)
        self.out = tp.ColumnParallelLinear(cfg.hidden, cfg.vocab, bias=False, group=group,
                                           sequence_parallel=sequence_parallel, pad_output=True)

    def forward(self, x):
        return self.out(self.norm(x))


class Decoder(nn.Module):
    """forward(tokens[, targets]): logits [seq, batch, vocab(/t)], or the mean
    cross-entropy (vocab-parallel) given targets. `first` / `last` build a
    pipeline stage without the embedding or the head; `layers` overrides how
    many decoder layers this stage holds; `ep_group` splits a Mixture of
    Experts' experts (decoder_moe)."""

    def __init__(self, cfg, tp_group=None, sequence_parallel=False, checkpointing="none",
                 recompute_mlp=False, attention="flash", layers=None, first=True, last=True,
                 ep_group=False):
        super().__init__()
        if checkpointing not in CHECKPOINTING:
            raise ValueError(f"decoder: activation checkpointing must be one of "
                             f"{', '.join(CHECKPOINTING)}, got {checkpointing!r}")
        if attention not in ("flash", "core"):
            raise ValueError(f"decoder: attention must be flash or core, got {attention!r}")
        self.cfg, self.group = cfg, tp._group(tp_group)
        t = tp._size_rank(self.group)[0]
        cfg.check(t)
        if cfg.experts and sequence_parallel:
            raise ValueError("decoder: sequence parallelism with experts is not supported "
                             "(the MoE layer replicates its tokens over tp)")
        group = self.group
        self.embed = Embedding(cfg, group, sequence_parallel) if first else None
        n = cfg.layers if layers is None else layers
        self.layers = nn.ModuleList(Layer(cfg, group, sequence_parallel, checkpointing,
                                          recompute_mlp, attention, ep_group)
                                    for _ in range(n))
        self.head = Head(cfg, group, sequence_parallel) if last else None

    def loss(self, logits, targets):
        return tp.vocab_parallel_cross_entropy(logits, targets.t(), self.cfg.vocab,
                                               self.group).mean()

    def forward(self, x, targets=None):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is None:
            return x
        logits = self.head(x)
        return logits if targets is None else self.loss(logits, targets)
