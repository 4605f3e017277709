"""A Mixture-of-Experts feed-forward layer: the top-k router, the token
dispatch, the experts and the combine.

    layer = MoE(MoEConfig(dim=64, hidden=128, num_experts=8, top_k=2,
                          capacity_factor=1.25))
    y = layer(x)                     # x, y: (..., dim)
    loss = task_loss + 0.01 * layer.aux_loss   # or moe.load_balancing_losses(model)

On one process the layer holds every expert; expert_parallel.
apply_expert_parallel(model, mesh) makes it hold this rank's experts and
exchange tokens over the mesh's "ep" dimension (and split each expert over
"tp"). Under torch.compile the gate and the experts are traced; the routing
decisions (softmax, top-k, capacity), the dispatch and the combine run
eagerly between the graphs (their sizes are data): a compiled block breaks
its graph there. With `static_rows` the experts always see (E_local, ep x
capacity, dim), one compiled shape.
"""
import dataclasses
from typing import Optional

import torch
import torch.nn as nn
from torch._compile import _disable_dynamo

from ..tensor_parallel import copy_to_tensor_parallel, reduce_from_tensor_parallel
from .dispatch import ExpertPlacement, combine, dispatch
from .experts import GroupedExperts
from .router import TopKRouter


@dataclasses.dataclass
class MoEConfig:
    """dim: model width; hidden: each expert's hidden width; top_k experts
    of num_experts per token; capacity_factor: None (no dropping) or the
    factor of router.capacity; activation "swiglu" or "gelu"; renormalize
    the top-k weights (Mixtral); static_rows: pad each expert's rows to
    ep x capacity (needs a capacity_factor)."""
    dim: int
    hidden: int
    num_experts: int = 8
    top_k: int = 2
    capacity_factor: Optional[float] = None
    activation: str = "swiglu"
    renormalize: bool = True
    static_rows: bool = False


@dataclasses.dataclass
class RoutingStats:
    """The last forward's routing on this rank: assignments kept per global
    expert (E,), assignments dropped, rows sent to and received from each
    ep rank."""
    tokens_per_expert: torch.Tensor
    dropped: int
    sent: list
    received: list


class MoE(nn.Module):
    """See the module docstring. After each forward, `aux_loss` is the
    router's load-balancing loss over this call's tokens (router.
    load_balancing_loss) and `stats` its RoutingStats."""

    def __init__(self, cfg):
        super().__init__()
        if cfg.static_rows and cfg.capacity_factor is None:
            raise ValueError("MoE: static_rows pads to ep x capacity and needs a "
                             "capacity_factor")
        self.cfg = cfg
        self.router = TopKRouter(cfg.dim, cfg.num_experts, cfg.top_k, cfg.capacity_factor,
                                 cfg.renormalize)
        self.experts = GroupedExperts(cfg.num_experts, cfg.dim, cfg.hidden, cfg.activation)
        self.placement = ExpertPlacement(cfg.num_experts, None, cfg.static_rows)
        self.tp_group = None  # experts' hidden dimension split over it
        self.aux_loss, self.stats = None, None

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        rows, plan = self._dispatch(flat, self.router.gate(flat))
        if self.tp_group is not None:
            rows = copy_to_tensor_parallel(rows, self.tp_group)
        out = self.experts(rows)
        if self.tp_group is not None:
            out = reduce_from_tensor_parallel(out, self.tp_group)
        return self._combine(out, plan, x.shape)

    @_disable_dynamo
    def _dispatch(self, flat, logits):
        routing = self.router.decide(logits, flat.shape[0])
        rows, plan = dispatch(flat, routing, self.placement)
        self.aux_loss = routing.aux_loss
        self.stats = RoutingStats(plan.send_counts, routing.dropped(),
                                  plan.input_splits, plan.output_splits)
        return rows, plan

    @_disable_dynamo
    def _combine(self, out, plan, shape):
        return combine(out, plan, shape)


def moe_layers(model):
    """The MoE layers of `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, MoE)]


def load_balancing_losses(model):
    """The sum of the last forward's aux_loss over `model`'s MoE layers."""
    losses = [m.aux_loss for m in moe_layers(model) if m.aux_loss is not None]
    if not losses:
        raise ValueError("MoE: no MoE layer of the model has run a forward")
    return torch.stack(losses).sum()
