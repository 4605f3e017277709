"""A small Mixtral-style GPT: causal attention, then a Mixture-of-Experts
feed-forward layer (top-k of E SwiGLU experts, torchneuron.parallel.moe)
in every block, with the plans that parallelize it.

    model = MoEGPT(MoEGPTConfig(vocab=256, seq=32, dim=64, heads=4, layers=2,
                                num_experts=8, top_k=2, capacity_factor=1.25))
    mesh = moe.expert_parallel_mesh("neuron", ep=4, tp=2)    # ("dp", "ep", "tp")
    apply_tensor_parallel(model, mesh["tp"])                 # attention: Colwise / Rowwise
    moe.apply_expert_parallel(model, mesh)                   # experts over "ep", split over "tp"
    loss = loss_fn(model(x), y) + cfg.aux_coefficient * moe.load_balancing_losses(model)

Mixtral's layer with two departures that keep it on the device's native
operators: LayerNorm for RMSNorm, and no rotary embedding (plain_gpt's
attention: the causal mask alone orders the tokens). Attention is
plain_gpt's, split over "tp" by parallelize_module as there.
"""
import dataclasses
from typing import Optional

import torch.nn as nn
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from ..parallel import moe
from .plain_gpt import Attention, loss_fn  # noqa: F401  (loss_fn: the same cross-entropy)


@dataclasses.dataclass
class MoEGPTConfig:
    vocab: int = 256
    seq: int = 32
    dim: int = 64
    heads: int = 4
    layers: int = 2
    num_experts: int = 8
    top_k: int = 2
    hidden: int = 128  # each expert's
    capacity_factor: Optional[float] = 1.25
    static_rows: bool = False  # pad experts' rows to ep x capacity (one compiled shape)
    aux_coefficient: float = 0.01

    def moe_config(self):
        return moe.MoEConfig(dim=self.dim, hidden=self.hidden, num_experts=self.num_experts,
                             top_k=self.top_k, capacity_factor=self.capacity_factor,
                             activation="swiglu", static_rows=self.static_rows)


class MoEBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.dim), Attention(cfg)
        self.ln2, self.moe = nn.LayerNorm(cfg.dim), moe.MoE(cfg.moe_config())

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class MoEGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleDict({str(i): MoEBlock(cfg) for i in range(cfg.layers)})
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, x):
        h = self.tok(x)
        for layer in self.layers.values():
            h = layer(h)
        return self.head(self.norm(h)).float()

    def parameter_counts(self):
        """(total, active per token) parameters of the one-device model,
        from the configuration: a token runs top_k of the num_experts
        experts."""
        cfg = self.cfg
        experts = 3 * cfg.dim * cfg.hidden  # w1, w3, w2 of one expert
        block = 4 * cfg.dim * cfg.dim + 4 * cfg.dim + cfg.dim * cfg.num_experts
        dense = 2 * cfg.vocab * cfg.dim + 2 * cfg.dim + cfg.layers * block
        return (dense + cfg.layers * cfg.num_experts * experts,
                dense + cfg.layers * cfg.top_k * experts)


def apply_tensor_parallel(model, tp_mesh):
    """Attention's q, k, v column-wise and o row-wise over `tp_mesh`
    (Megatron's split; the experts are split by moe.apply_expert_parallel)."""
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel()}
    for layer in model.layers.values():
        parallelize_module(layer, tp_mesh, plan)
    return model
