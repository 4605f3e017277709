"""The Mixture-of-Experts feed-forward layer of torchneuron.models.decoder
(a Mixtral-style decoder: DecoderConfig.experts > 0), with static shapes.

Routing is torchneuron.parallel.moe's: a gate (hidden -> experts, no bias,
replicated), softmax in float32, the top-k experts per token with their
weights renormalised (Mixtral), and each expert taking at most
`capacity = ceil(capacity_factor x tokens x k / experts)` of a rank's
token assignments in priority order, first choices first (moe.router's
capacity and priority_positions); the load-balancing loss is Switch's
(`aux_loss` after each forward). The dispatch is padded to capacity
(GShard's and Switch's dispatch; Megatron-LM's
moe_pad_expert_input_to_capacity): every exchange and every expert matmul
has one shape whatever the routing,

    tokens (N, hidden) -> send buffer (experts, capacity, hidden)
      -> all-to-all over ep, equal splits of experts / ep x capacity rows
      -> (experts / ep, ep x capacity, hidden) -> the rank's experts
      -> the reverse all-to-all -> each token's kept choices, weighted, summed.

This is the layer `neuronrun predict` captures at full size: a step costs
what the capacity makes it cost, whatever one batch's routing does.
Tokens are replicated over the tensor-parallel group (every tp rank routes
the same tokens and exchanges them with the ranks of its ep group at the
same tensor position, as torchneuron.parallel.moe does); each expert's
hidden dimension is split over tp (Megatron's MLP split: the experts'
input copied to tp, their output all-reduced). Sequence parallelism is
not supported with experts.

    ffn = MoEFeedForward(cfg, tp_group=None, ep_group=None)   # one rank: every expert
    y = ffn(x)                      # x, y: (seq, batch, hidden)
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from ..parallel import tensor_parallel as tp
from ..parallel.moe.all_to_all import all_to_all
from ..parallel.moe.experts import GroupedExperts
from ..parallel.moe.router import capacity, priority_positions


def ep_size_rank(group):
    """(size, rank) of an expert-parallel group: None or False is one rank;
    a tensor_parallel.CapturedGroup (torchneuron.predict) its own."""
    if group is None or group is False:
        return 1, 0
    if isinstance(group, tp.CapturedGroup):
        return group.size, group.rank
    return dist.get_world_size(group), dist.get_rank(group)


def static_load_balancing_loss(probs, experts, num_experts):
    """moe.router.load_balancing_loss without bincount (a data-dependent
    size): E * sum_i f_i * P_i over probs (N, E) and choices experts (N, k)."""
    n, k = experts.shape
    chosen = torch.zeros_like(probs).scatter_(1, experts, 1.0)  # (N, E): 1 where chosen
    return num_experts * torch.sum(chosen.sum(0) / (n * k) * probs.mean(0))


class MoEFeedForward(nn.Module):
    """See the module docstring. `tp_group` splits each expert's hidden
    dimension, `ep_group` the experts (ep rank r holds experts
    [r * E / ep, (r + 1) * E / ep)); ValueError naming the sizes when ep
    does not divide the experts."""

    def __init__(self, cfg, tp_group=False, ep_group=False):
        super().__init__()
        t, tp_rank = tp._size_rank(tp_group)
        ep, ep_rank = ep_size_rank(ep_group)
        if cfg.experts % ep:
            raise ValueError(f"decoder: ep {ep} does not divide the {cfg.experts} experts")
        self.num_experts, self.top_k = cfg.experts, cfg.top_k
        self.capacity_factor = cfg.capacity_factor or 1.0
        self.tp_group, self.ep_group, self.ep = tp_group, ep_group, ep
        self.local = cfg.experts // ep
        self.gate = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = GroupedExperts(cfg.experts, cfg.hidden, cfg.ffn_hidden, cfg.activation)
        self.experts.keep(ep_rank * self.local, self.local, tp_rank, t)
        self.aux_loss = None

    def _exchange(self, x):
        """x (ep, rows, hidden): block r to ep rank r; returns the blocks
        received, block r from ep rank r."""
        if self.ep == 1:
            return x
        if isinstance(self.ep_group, tp.CapturedGroup):
            return self.ep_group.recorder.all_to_all(x, self.ep_group)
        splits = [x.shape[1]] * self.ep
        flat = all_to_all(x.reshape(-1, x.shape[-1]), splits, splits, self.ep_group)
        return flat.view(x.shape)

    def _route(self, flat):
        """(slots (N, k): each choice's row of the send buffer, E x C for a
        dropped one; weights (N, k), zero where dropped; C)."""
        n = flat.shape[0]
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        top, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = top / top.sum(dim=-1, keepdim=True)
        c = capacity(n, self.num_experts, self.top_k, self.capacity_factor)
        positions = priority_positions(experts, self.num_experts)
        kept = positions < c
        slots = torch.where(kept, experts * c + positions, self.num_experts * c)
        self.aux_loss = static_load_balancing_loss(probs, experts, self.num_experts)
        return slots, (weights * kept).to(flat.dtype), c

    def forward(self, x):
        s, b, h = x.shape
        flat = x.reshape(s * b, h)
        slots, weights, c = self._route(flat)
        e, ep, local = self.num_experts, self.ep, self.local
        rows = flat.unsqueeze(1).expand(-1, self.top_k, -1).reshape(-1, h)
        send = flat.new_zeros(e * c + 1, h).index_copy(0, slots.reshape(-1), rows)[:e * c]
        got = self._exchange(send.view(ep, local * c, h))
        mine = got.view(ep, local, c, h).transpose(0, 1).reshape(local, ep * c, h)
        mine = tp.copy_to_tensor_parallel(mine, self.tp_group)
        out = tp.reduce_from_tensor_parallel(self.experts(mine), self.tp_group)
        back = out.view(local, ep, c, h).transpose(0, 1).reshape(ep, local * c, h)
        back = self._exchange(back).reshape(e * c, h)
        back = torch.cat([back, back.new_zeros(1, h)])  # row E x C: a dropped choice's
        y = (back[slots] * weights.unsqueeze(-1)).sum(dim=1)
        return y.view(s, b, h)
