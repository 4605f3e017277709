"""The experts of a Mixture-of-Experts layer: E feed-forward networks with
their weights stacked, computed together as batched matmuls.

    experts = GroupedExperts(num_experts=8, dim=64, hidden=128, activation="swiglu")
    y = experts(x)                   # x, y: (E_local, R, dim): R rows per expert

"swiglu" (Mixtral): w2(silu(x w1) * (x w3)); "gelu": w2(gelu(x w1)); no
biases. Weights are w1, w3: (E, dim, hidden), w2: (E, hidden, dim),
initialised in full from the default RNG as nn.Linear initialises each
expert's weights (uniform within 1/sqrt(fan_in)), so a layer whose experts
are later split over expert and tensor parallelism (`keep`) starts where the
one-device layer does. SiLU is written x * sigmoid(x): ops the device runs
natively, so compiled experts stay on the device forward and backward.
"""
import math

import torch
import torch.nn as nn

ACTIVATIONS = ("swiglu", "gelu")


def _uniform(shape, fan_in):
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class GroupedExperts(nn.Module):
    """E experts' weights stacked along dim 0 (this rank's: `num_local`
    of them, from `first`, after keep()). Every parameter carries
    `expert_parallel = True`: gradient reduction treats it apart
    (expert_parallel.reduce_gradients)."""

    def __init__(self, num_experts, dim, hidden, activation="swiglu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoE: activation {activation!r} is not one of {ACTIVATIONS}")
        self.activation = activation
        self.num_experts, self.dim, self.hidden = num_experts, dim, hidden
        self.first, self.num_local = 0, num_experts
        self.w1 = _uniform((num_experts, dim, hidden), dim)
        self.w2 = _uniform((num_experts, hidden, dim), hidden)
        self.w3 = _uniform((num_experts, dim, hidden), dim) if activation == "swiglu" else None
        for p in self.parameters():
            p.expert_parallel = True

    def keep(self, first, count, hidden_part=0, hidden_parts=1):
        """Keeps experts [first, first + count) and, for tensor parallelism,
        part `hidden_part` of `hidden_parts` equal slices of the hidden
        dimension (w1, w3 by columns, w2 by rows: Megatron's MLP split)."""
        if self.hidden % hidden_parts:
            raise ValueError(f"MoE: hidden size {self.hidden} does not split over tp "
                             f"{hidden_parts}")
        width = self.hidden // hidden_parts
        cols = slice(hidden_part * width, (hidden_part + 1) * width)
        experts = slice(first, first + count)

        def cut(p, index):
            q = nn.Parameter(p.detach()[index].clone())
            q.expert_parallel = True
            return q
        self.w1 = cut(self.w1, (experts, slice(None), cols))
        self.w2 = cut(self.w2, (experts, cols, slice(None)))
        if self.w3 is not None:
            self.w3 = cut(self.w3, (experts, slice(None), cols))
        self.first, self.num_local = first, count
        return self

    def forward(self, x):
        """x: (E_local, R, dim) -> (E_local, R, dim); rows of zeros give
        zeros (padding)."""
        h = torch.bmm(x, self.w1)
        if self.activation == "swiglu":
            h = h * torch.sigmoid(h) * torch.bmm(x, self.w3)
        else:
            h = torch.nn.functional.gelu(h)
        return torch.bmm(h, self.w2)
