"""Token dispatch and combine: from a router's decisions to the experts'
input rows and back, locally or over expert parallelism.

    placement = ExpertPlacement(num_experts=8)                  # one process
    placement = ExpertPlacement(8, ep_group=mesh["ep"].get_group())
    rows, plan = dispatch(x, routing, placement)                # (E_local, R, dim)
    out = combine(experts(rows), plan)                          # (N, dim)

dispatch sorts the kept assignments by expert (within an expert, in the
router's priority order), exchanges the per-expert counts with the ep
group (all_to_all_single of counts), then the token rows (all_to_all_single
with uneven split sizes: as many rows to each ep rank as its experts
receive, zero included) and lays the rows received out as a (E_local, R,
dim) buffer: expert e's rows from source rank 0 first, then 1, ..., then
zero padding up to R. R is the most rows any local expert received, or
with `static_rows` (capacity routing) always ep x capacity, so compiled
experts see one shape. combine takes the experts' rows back through the
reverse all_to_all_single and adds each one, times its routing weight,
into its token's output. Without an ep group the exchanges are skipped;
the arithmetic is the same.
"""
import dataclasses

import torch
import torch.distributed as dist

from .all_to_all import all_to_all, exchange_counts


@dataclasses.dataclass
class ExpertPlacement:
    """Which experts this rank holds: ep ranks hold num_experts / ep
    consecutive experts each (ep rank r: [r * E_local, (r + 1) * E_local)).
    `ep_group` None: one rank holds them all. `static_rows`: pad every
    expert's buffer to ep x capacity rows (needs a capacity)."""
    num_experts: int
    ep_group: object = None
    static_rows: bool = False

    @property
    def ep(self):
        return 1 if self.ep_group is None else dist.get_world_size(self.ep_group)

    @property
    def ep_rank(self):
        return 0 if self.ep_group is None else dist.get_rank(self.ep_group)

    @property
    def num_local(self):
        return self.num_experts // self.ep


@dataclasses.dataclass
class DispatchPlan:
    """What combine needs: the token of each row sent (N_sent,), its weight
    (N_sent,), the split sizes both ways, each received row's slot in the
    (E_local * R) buffer, the token count N, and the counts exchanged
    (send: (E,), received: (ep * E_local,), on the CPU) and the ep group."""
    tokens: torch.Tensor
    weights: torch.Tensor
    input_splits: list
    output_splits: list
    slots: torch.Tensor
    num_tokens: int
    send_counts: torch.Tensor
    recv_counts: torch.Tensor
    group: object = None


def _sorted_assignments(routing, num_experts):
    """The kept assignments sorted by expert, then priority (choice, token):
    (token index, expert, weight) per row, and the counts per expert."""
    n, k = routing.experts.shape
    experts = routing.experts.t().reshape(-1)  # priority order: choice-major
    kept = routing.kept.t().reshape(-1)
    priority = torch.arange(n * k, device=experts.device)
    key = torch.where(kept, experts * (n * k) + priority, num_experts * n * k + priority)
    order = torch.argsort(key)[: int(kept.sum())]
    tokens = priority[order] % n
    counts = torch.bincount(experts[order], minlength=num_experts)
    return tokens, routing.weights.t().reshape(-1)[order], counts


def _buffer_slots(recv_counts, ep, num_local, rows):
    """For each received row (source-major, then local expert), its slot in
    the (E_local * R) buffer: expert e's rows from source 0, 1, ... at
    e * R + 0, 1, ...; recv_counts (ep, E_local) on the CPU."""
    per_segment = recv_counts.reshape(-1)
    ahead = torch.cumsum(recv_counts, dim=0) - recv_counts  # rows of earlier sources
    base = (torch.arange(num_local) * rows)[None, :] + ahead
    starts = torch.cumsum(per_segment, 0) - per_segment
    total = int(per_segment.sum())
    within = torch.arange(total) - torch.repeat_interleave(starts, per_segment)
    return torch.repeat_interleave(base.reshape(-1), per_segment) + within


def dispatch(x, routing, placement):
    """x: (N, dim), routing: the router's Routing. Returns (rows
    (E_local, R, dim), DispatchPlan)."""
    tokens, weights, counts = _sorted_assignments(routing, placement.num_experts)
    ep, num_local, group = placement.ep, placement.num_local, placement.ep_group
    send = counts.to(torch.int64)
    recv = send if group is None else exchange_counts(send, group)
    send_cpu, recv_cpu = send.cpu(), recv.cpu().view(ep, num_local)
    input_splits = send_cpu.view(ep, num_local).sum(1).tolist()
    output_splits = recv_cpu.sum(1).tolist()
    if placement.static_rows:
        if routing.capacity is None:
            raise ValueError("MoE: static_rows pads to ep x capacity and needs a "
                             "capacity_factor")
        rows = ep * routing.capacity
    else:
        rows = int(recv_cpu.sum(0).max()) if recv_cpu.numel() else 0
    sent = x[tokens.to(x.device)]
    got = sent if group is None else all_to_all(sent, output_splits, input_splits, group)
    slots = _buffer_slots(recv_cpu, ep, num_local, rows).to(x.device)
    buffer = x.new_zeros((num_local * rows, x.shape[1])).index_copy(0, slots, got)
    plan = DispatchPlan(tokens.to(x.device), weights, input_splits, output_splits, slots,
                        x.shape[0], send_cpu, recv_cpu.reshape(-1), group)
    return buffer.view(num_local, rows, x.shape[1]), plan


def combine(rows, plan, shape=None):
    """rows: the experts' (E_local, R, dim) output. Returns (N, dim), or
    `shape` (its product N x dim; a tensor of its own, not a view): each
    token's sum over its kept assignments of weight x expert output (zero
    for a token whose every assignment was dropped)."""
    dim = rows.shape[-1]
    flat = rows.reshape(-1, dim)[plan.slots]
    back = flat if plan.group is None else all_to_all(flat, plan.input_splits,
                                                      plan.output_splits, plan.group)
    weighted = back * plan.weights.to(back.dtype)[:, None]
    out = back.new_zeros(shape if shape is not None else (plan.num_tokens, dim))
    out.view(plan.num_tokens, dim).index_add_(0, plan.tokens, weighted)
    return out
