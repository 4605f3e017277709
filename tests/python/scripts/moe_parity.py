#!/usr/bin/env python3
"""Mixture-of-Experts training under expert parallelism against one process:
a small MoE language model (two MoE layers, top-2 of 4 experts, capacity
factor 1, so tokens are dropped) trained 10 steps with AdamW in each
layout, against the same model trained in one process on the CPU.

    neuronrun -n 2 tests/python/scripts/moe_parity.py --cases ep2,dp2,ep2-fsdp2
    neuronrun -n 4 tests/python/scripts/moe_parity.py       # the 4-rank cases
    neuronrun -n 4 tests/python/scripts/moe_parity.py --cpu # the same on Gloo

Each layout splits the batch into dp x ep shards (rank (dp_rank, ep_rank)
takes shard dp_rank * ep + ep_rank; its tp ranks share it). The reference
is one process that runs the shards one after another and accumulates
their gradients, each scaled by 1 / shards (capacity and the
load-balancing loss are per shard, as on the ranks), then steps. Every
case's per-step losses (the mean over the shards of cross-entropy + 0.01
x load-balancing loss; within 1e-5), its first step's reduced gradients
(moe.full_gradients; rtol 1e-4, atol 1e-7: AdamW hides a gradient's scale
from the losses) and its final parameters, gathered whole
(moe.full_state_dict; rtol 1e-4, atol 1e-5) must equal the reference's.
Rank 0 prints one line per case, then "moe parity: N cases ok".
"""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torchneuron  # noqa: F401  (registers the "neuron" device and backend)
from torchneuron.parallel import moe

VOCAB, DIM, STEPS, AUX = 32, 16, 10, 0.01
# name: (dp, ep, tp, FSDP2, batch, sequence)
CASES = {
    "ep2": (1, 2, 1, False, 8, 8),
    "dp2": (2, 1, 1, False, 8, 8),
    "ep2-fsdp2": (1, 2, 1, True, 8, 8),
    "dp2xep2": (2, 2, 1, False, 8, 8),
    "dp2xep2-fsdp2": (2, 2, 1, True, 8, 8),
    "ep4": (1, 4, 1, False, 8, 8),
    # One token per rank: each rank sends to two ep ranks and nothing to the
    # others; some ranks' experts receive no token at all (zero splits).
    "ep4-one-token": (1, 4, 1, False, 4, 1),
    "ep2xtp2": (1, 2, 2, False, 8, 8),
    "ep2xtp2-fsdp2": (1, 2, 2, True, 8, 8),
}
DEFAULT = {2: ["ep2", "dp2", "ep2-fsdp2"],
           4: ["dp2xep2", "dp2xep2-fsdp2", "ep4", "ep4-one-token", "ep2xtp2", "ep2xtp2-fsdp2"]}


class MoELM(nn.Module):
    """Embedding, two pre-norm residual MoE layers (SwiGLU experts, then
    GELU experts), a final norm and the head."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(2))
        self.moes = nn.ModuleList(
            moe.MoE(moe.MoEConfig(dim=DIM, hidden=32, num_experts=4, top_k=2,
                                  capacity_factor=1.0, activation=act))
            for act in ("swiglu", "gelu"))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.tok(x)
        for norm, layer in zip(self.norms, self.moes):
            h = h + layer(norm(h))
        return self.head(self.norm(h))


def reference_model():
    torch.manual_seed(0)
    return MoELM()


def loss_fn(model, x, y):
    logits = model(x)
    ce = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1))
    return ce + AUX * moe.load_balancing_losses(model)


def batch(size, seq):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (size, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2, foreach=False)


def reference(shards, size, seq):
    """(losses, first step's gradients, final state dict, assignments
    dropped) of one process running the `shards` shards of each step one
    after another."""
    model = reference_model()
    opt, losses, dropped, grads = optimizer(model.parameters()), [], 0, None
    xs, ys = (t.chunk(shards) for t in batch(size, seq))
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for x, y in zip(xs, ys):
            loss = loss_fn(model, x, y)
            (loss / shards).backward()
            total += loss.item() / shards
            dropped += sum(m.stats.dropped for m in moe.moe_layers(model))
        if grads is None:
            grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        losses.append(total)
    return losses, grads, {k: v.detach() for k, v in model.state_dict().items()}, dropped


def run_case(name, device):
    """Trains the case's layout; returns (losses, first step's gradients,
    full state dict, zero splits seen on this rank), gathered whole."""
    dp, ep, tp, fsdp2, size, seq = CASES[name]
    mesh = moe.expert_parallel_mesh(device.type, ep=ep, tp=tp)
    model = moe.apply_expert_parallel(reference_model().to(device), mesh)
    if fsdp2:
        moe.apply_fully_shard(model, mesh, modules=list(model.moes))
    shard = mesh["dp"].get_local_rank() * ep + mesh["ep"].get_local_rank()
    x, y = (t.chunk(dp * ep)[shard].to(device) for t in batch(size, seq))
    opt, losses, zero_splits, grads = optimizer(model.parameters()), [], 0, None
    replicas = moe.replica_mesh(mesh).get_group()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model, x, y)
        loss.backward()
        if not fsdp2:
            moe.reduce_gradients(model, mesh)
        if grads is None:
            grads = moe.full_gradients(model, mesh)
        opt.step()
        zero_splits += sum(m.stats.sent.count(0) + m.stats.received.count(0)
                           for m in moe.moe_layers(model))
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=replicas)
        losses.append(mean.item() / (dp * ep))
    return losses, grads, moe.full_state_dict(model, mesh), zero_splits


def check_case(name, device, backend, references):
    dp, ep, tp, fsdp2, size, seq = CASES[name]
    key = (dp * ep, size, seq)
    if key not in references:
        references[key] = reference(*key)
    ref_losses, ref_grads, ref_state, dropped = references[key]
    losses, grads, state, zero_splits = run_case(name, device)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"case {name}: losses {losses} against the "
                                             f"reference {ref_losses}: {m}")
    # Gradients first: AdamW's update hardly depends on a gradient's scale,
    # so a reduction divided wrongly shows here, not in the losses.
    assert sorted(grads) == sorted(ref_grads), (sorted(grads), sorted(ref_grads))
    for k, g in grads.items():
        torch.testing.assert_close(g.cpu(), ref_grads[k], rtol=1e-4, atol=1e-7,
                                   msg=lambda m: f"case {name}: gradient of {k}: {m}")
    assert sorted(state) == sorted(ref_state), (sorted(state), sorted(ref_state))
    for k, v in state.items():
        torch.testing.assert_close(v.cpu(), ref_state[k], rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"case {name}: parameter {k}: {m}")
    assert all(math.isfinite(v) for v in losses)
    zeros = torch.tensor([zero_splits])
    dist.all_reduce(zeros)
    if dist.get_rank() == 0:
        print(f"moe parity {name} on {device.type}/{backend}: dp {dp} x ep {ep} x tp {tp}"
              f"{' FSDP2' if fsdp2 else ''}, {STEPS} steps, losses "
              + " ".join(f"{v:.6f}" for v in losses)
              + f"; {len(grads)} gradients and {len(state)} tensors equal; "
              f"{dropped} assignments dropped; "
              f"{int(zeros.item())} zero splits", flush=True)


def expect_value_error(fn, message):
    try:
        fn()
    except ValueError as e:
        assert message in str(e), (str(e), message)
        return 1
    raise AssertionError(f"no ValueError ({message!r})")


def check_refusals(device):
    """The layouts the layer cannot take are refused, naming the values
    (a ValueError on every rank, before any collective is issued)."""
    world = dist.get_world_size()
    refused = expect_value_error(lambda: moe.expert_parallel_mesh(device.type, ep=3),
                                 f"world size {world} is not divisible by ep x tp = 3 x 1 = 3")
    mesh = moe.expert_parallel_mesh(device.type, ep=world)
    uneven = moe.MoE(moe.MoEConfig(dim=DIM, hidden=32, num_experts=world + 1, top_k=2))
    refused += expect_value_error(lambda: moe.apply_expert_parallel(uneven, mesh),
                                  f"ep {world} does not divide num_experts {world + 1}")
    odd = moe.MoE(moe.MoEConfig(dim=DIM, hidden=33, num_experts=4, top_k=2))
    refused += expect_value_error(
        lambda: moe.apply_expert_parallel(odd, moe.expert_parallel_mesh(device.type, ep=1,
                                                                        tp=world)),
        f"hidden size 33 does not split over tp {world}")
    refused += expect_value_error(lambda: moe.apply_expert_parallel(uneven, mesh["dp", "tp"]),
                                  "the device mesh needs a dimension named 'ep'")
    if dist.get_rank() == 0:
        print(f"moe parity: {refused} layouts refused on {world} ranks", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the CPU and Gloo instead of the accelerator")
    p.add_argument("--cases", help="comma-separated (default: this world size's cases)")
    p.add_argument("--refusals", action="store_true", help="check the refused layouts first")
    args = p.parse_args()
    if args.cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        accelerator = torch.accelerator.current_accelerator()
        device = torch.device(accelerator.type, torch.accelerator.current_device_index())
        backend = dist.get_default_backend_for_device(accelerator)
    dist.init_process_group(backend=backend)
    cases = args.cases.split(",") if args.cases else DEFAULT[dist.get_world_size()]
    if args.refusals:
        check_refusals(device)
    references = {}
    for name in cases:
        check_case(name, device, backend, references)
    if dist.get_rank() == 0:
        print(f"moe parity: {len(cases)} cases ok on {dist.get_world_size()} ranks, "
              f"{device.type}/{backend}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
