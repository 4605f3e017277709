"""A small GPT of plain torch.nn layers, for PyTorch's own parallel APIs
(DTensor, FSDP2, torch.distributed.pipelining), with the plans that
parallelize it.

    model = GPT(PlainGPTConfig(vocab=256, seq=32, dim=64, heads=4, layers=4))
    apply_tensor_parallel(model, mesh["tp"], sequence_parallel=True)
    apply_fully_shard(model, mesh["dp"])
    stage = pipeline_stage(model, stages=2, index=0)  # before the two above

Attention reshapes to the heads it holds (`view(b, s, -1, head_dim)`), so
a column-wise split of q, k and v hands each tensor-parallel rank whole
heads. The forward skips the parts a pipeline stage has deleted (the
embedding before the first stage, the norm and head after the last), so a
stage is the same class with fewer parts. torchneuron.models.gpt is the
counterpart built from torchneuron.parallel's own layers.
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)


@dataclasses.dataclass
class PlainGPTConfig:
    vocab: int = 256
    seq: int = 32
    dim: int = 64
    heads: int = 4
    layers: int = 4


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if cfg.dim % cfg.heads:
            raise ValueError(f"dim {cfg.dim} does not split into {cfg.heads} heads")
        self.head_dim = cfg.dim // cfg.heads
        self.q, self.k, self.v, self.o = (nn.Linear(cfg.dim, cfg.dim, bias=False)
                                          for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        heads = lambda t: t.view(b, s, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                           is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1, self.w2 = nn.Linear(cfg.dim, 4 * cfg.dim), nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.dim), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.dim), MLP(cfg)
        self.checkpointed = False  # activation checkpointing

    def _forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x):
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, x):
        h = self.tok(x) if self.tok is not None else x
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        if self.head is None:
            return h
        # float32 logits in a tensor of their own: under tensor parallelism the
        # head's output is DTensor.to_local()'s view, and FSDP2 warns that a
        # view returned by a wrapped module loses its pre-backward hook to an
        # in-place op on it.
        return self.head(h).float().clone()


def loss_fn(logits, targets):
    """Cross-entropy over the vocabulary (mean over tokens)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tensor_parallel_plans(sequence_parallel):
    """(root plan, per-block plan): Megatron's split, attention and MLP
    column- then row-wise; with sequence parallelism the norms and residuals
    hold a slice of the sequence, gathered before attention and MLP
    (torchtitan's plan)."""
    block = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
             "attn.v": ColwiseParallel(), "mlp.w1": ColwiseParallel()}
    if sequence_parallel:
        gather = lambda: PrepareModuleInput(input_layouts=Shard(1),  # noqa: E731
                                            desired_input_layouts=Replicate())
        block.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                      "attn": gather(), "mlp": gather(),
                      "attn.o": RowwiseParallel(output_layouts=Shard(1)),
                      "mlp.w2": RowwiseParallel(output_layouts=Shard(1))})
        root = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
                "norm": SequenceParallel(),
                "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    else:
        block.update({"attn.o": RowwiseParallel(), "mlp.w2": RowwiseParallel()})
        root = {"tok": RowwiseParallel(input_layouts=Replicate()),
                "head": ColwiseParallel(output_layouts=Replicate())}
    return root, block


def apply_tensor_parallel(model, tp_mesh, sequence_parallel=False):
    """parallelize_module over `tp_mesh` with tensor_parallel_plans (the
    parts a pipeline stage deleted are left out)."""
    root, block = tensor_parallel_plans(sequence_parallel)
    parallelize_module(model, tp_mesh, {k: v for k, v in root.items()
                                        if getattr(model, k) is not None})
    for layer in model.layers.values():
        parallelize_module(layer, tp_mesh, block)
    return model


def apply_fully_shard(model, dp_mesh, **kwargs):
    """FSDP2: each block, then the root (the embedding, norm and head);
    `kwargs` go to fully_shard (mp_policy, offload_policy, ...)."""
    for layer in model.layers.values():
        fully_shard(layer, mesh=dp_mesh, **kwargs)
    return fully_shard(model, mesh=dp_mesh, **kwargs)


def pipeline_stage(model, stages, index):
    """`model` cut to stage `index` of `stages` equal runs of blocks: the
    other blocks, and the embedding (all but the first stage) or the norm
    and head (all but the last), deleted."""
    per = len(model.layers) // stages
    if per * stages != len(model.layers):
        raise ValueError(f"{len(model.layers)} layers do not split into {stages} equal stages")
    keep = range(index * per, (index + 1) * per)
    model.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in keep})
    if index != 0:
        model.tok = None
    if index != stages - 1:
        model.norm, model.head = None, None
    return model
