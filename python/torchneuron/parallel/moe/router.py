"""The top-k router of a Mixture-of-Experts layer: softmax gating, top-k
experts per token, renormalised weights (Mixtral), an expert capacity with
token dropping (Switch / GShard), and the auxiliary load-balancing loss.

    router = TopKRouter(dim=64, num_experts=8, top_k=2, capacity_factor=1.25)
    routing = router(x)              # x: (N, dim), N tokens
    routing.experts, routing.weights, routing.kept   # (N, k) each
    routing.aux_loss                 # num_experts * sum_i f_i * P_i

Capacity and dropping (what `kept` says). Each expert takes at most
`capacity(N, E, k, factor) = ceil(factor * N * k / E)` of the N tokens the
router sees in one call (one rank's tokens under data or expert
parallelism: the decision is local, made before any exchange). Assignments
are served in priority order, first choices before second choices (GShard),
and within one choice by token position (Switch): an assignment (token i,
choice j) is kept when fewer than `capacity` assignments to its expert come
before it in the order (j, i). A dropped assignment contributes nothing to
the token's output (the residual carries the token); the other choices keep
their renormalised weights, which are not renormalised again. Without a
capacity factor nothing is dropped.
"""
import dataclasses
import math

import torch
import torch.nn as nn


def capacity(tokens, num_experts, top_k, capacity_factor):
    """Assignments one expert takes out of `tokens` tokens routed to
    `top_k` of `num_experts` experts each: ceil(factor * tokens * k / E);
    None (no limit) without a factor."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / num_experts)


def load_balancing_loss(probs, experts, num_experts):
    """Switch / GShard's auxiliary loss, E * sum_i f_i * P_i, for router
    probabilities `probs` (N, E) and chosen experts `experts` (N, k): f_i is
    the fraction of the N * k assignments that chose expert i (before any
    dropping; not differentiable), P_i the mean probability of expert i over
    the N tokens. 1.0 when both are uniform; k-independent (Megatron-LM's
    switch_load_balancing_loss_func with its coefficient 1)."""
    n, k = experts.shape
    counts = torch.bincount(experts.reshape(-1), minlength=num_experts)
    f = counts.to(probs.dtype) / (n * k)
    p = probs.mean(dim=0)
    return num_experts * torch.sum(f * p)


def priority_positions(experts, num_experts):
    """For each assignment (token i, choice j) of `experts` (N, k), how many
    assignments to the same expert precede it in priority order (choice j,
    then token i): (N, k), int64."""
    order = experts.t().reshape(-1)  # choice-major: (j, i)
    one_hot = torch.nn.functional.one_hot(order, num_experts)
    before = (torch.cumsum(one_hot, dim=0) - one_hot).gather(1, order[:, None])[:, 0]
    return before.view(experts.shape[1], experts.shape[0]).t()


@dataclasses.dataclass
class Routing:
    """One router call's decisions for N tokens (k choices each):
    experts (N, k) int64, weights (N, k) (renormalised over the k choices,
    the probabilities' dtype), kept (N, k) bool (within capacity), probs
    (N, E) float32, aux_loss (a scalar), capacity (int or None)."""
    experts: torch.Tensor
    weights: torch.Tensor
    kept: torch.Tensor
    probs: torch.Tensor
    aux_loss: torch.Tensor
    capacity: object

    def tokens_per_expert(self, num_experts):
        """Kept assignments per expert: (E,) int64."""
        return torch.bincount(self.experts[self.kept], minlength=num_experts)

    def dropped(self):
        """The number of assignments dropped for capacity."""
        return int((~self.kept).sum())


class TopKRouter(nn.Module):
    """A linear gate (dim -> num_experts, no bias), softmax in float32, the
    top `top_k` experts per token with their probabilities renormalised to
    sum to 1 (`renormalize`, Mixtral; else the raw probabilities, as Switch
    with k = 1), and the capacity of the module docstring."""

    def __init__(self, dim, num_experts, top_k, capacity_factor=None, renormalize=True):
        super().__init__()
        check_router(num_experts, top_k, capacity_factor)
        self.num_experts, self.top_k = num_experts, top_k
        self.capacity_factor, self.renormalize = capacity_factor, renormalize
        self.gate = nn.Linear(dim, num_experts, bias=False)

    def forward(self, x):
        """x: (N, dim) -> Routing."""
        return self.decide(self.gate(x), x.shape[0])

    def decide(self, logits, tokens):
        """The decisions from the gate's logits (N, E) for `tokens` = N."""
        probs = torch.softmax(logits.float(), dim=-1)
        top, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = top / top.sum(dim=-1, keepdim=True) if self.renormalize else top
        limit = capacity(tokens, self.num_experts, self.top_k, self.capacity_factor)
        if limit is None:
            kept = torch.ones_like(experts, dtype=torch.bool)
        else:
            kept = priority_positions(experts, self.num_experts) < limit
        aux = load_balancing_loss(probs, experts, self.num_experts)
        return Routing(experts, weights, kept, probs, aux, limit)


def check_router(num_experts, top_k, capacity_factor):
    """ValueError naming the value when the router cannot be made."""
    if num_experts < 1:
        raise ValueError(f"MoE: num_experts must be at least 1, got {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"MoE: top_k {top_k} must be between 1 and num_experts "
                         f"{num_experts}")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"MoE: capacity_factor must be positive (or None: no dropping), "
                         f"got {capacity_factor}")
