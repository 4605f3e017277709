#!/usr/bin/env python3
"""ZeRO parity: torchneuron.parallel.FullyShardedDataParallel at stages 1, 2
and 3 against a single-process reference computed on every rank.

    neuronrun -n 4 tests/python/scripts/zero_parity.py [--stages 123] [--steps 10]

The model (Linear, LayerNorm, GELU, Linear, GELU, Linear; each Linear its own
unit, the LayerNorm in the root unit) starts from a different seed on every
rank (the wrapper makes rank 0's the common start) and trains with AdamW
(weight decay) on a global batch of 24 split into contiguous shards. The
reference starts from rank 0's state; per step it computes every shard's
gradient, sums them in rank order, divides by the world size (what the
sharded reduction computes) and steps its own AdamW. Checked, bitwise in
fp32: every step's loss on every rank against the reference's for that
rank's shard, and the full state dict after the last step. Then, stage 3:
clip_grad_norm_ against the reference's global norm; bf16 compute over fp32
masters within bf16 tolerance of the fp32 loss; CPU offload trains bitwise
alike and charges its host traffic to the modelled time; activation checkpointing
inside units leaves the gradients bitwise unchanged; load_full_state_dict round
trip and its error naming a mismatched tensor. no_sync() at every stage
(bitwise equal to DDP's gradient accumulation, nothing reduced inside it,
and an abandoned accumulation discarded by zero_grad()); size_policy's units; prefetch (the next unit's all-gather in flight
when a unit's forward starts, none without it, the same losses); a bf16
gradient reduction within bf16 precision. Rank 0 prints one line per
check.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint

import torchneuron  # registers "neuron"
import torchneuron.fabric
import torchneuron.parallel as parallel

import job  # tests/python/scripts/job.py: the shared job start

SEED, BATCH, IN, HIDDEN, OUT, LR = 7, 24, 12, 20, 6, 0.01


def make():
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.LayerNorm(HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, OUT))


def batch(step):
    g = torch.Generator().manual_seed(SEED * 100 + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def shard(t, r, world):
    n = BATCH // world
    return t[r * n:(r + 1) * n]


def optimizer(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)


class Reference:
    def __init__(self, world):
        torch.manual_seed(SEED)  # rank 0's start
        self.model, self.world = make(), world
        self.opt = optimizer(self.model.parameters())

    def average_grads(self, x, y, parts=(slice(None),)):
        """Sets every .grad to what the sharded reduction computes: each
        rank's gradient (its shard of the batch, accumulated over `parts` of
        it in order), summed in rank order, divided by the world size.
        Returns each rank's loss on its first part."""
        losses, grads = [], []
        for r in range(self.world):
            self.model.zero_grad(set_to_none=True)
            rx, ry = shard(x, r, self.world), shard(y, r, self.world)
            for k, part in enumerate(parts):
                loss = nn.functional.mse_loss(self.model(rx[part]), ry[part])
                loss.backward()
                if k == 0:
                    losses.append(loss.detach())
            grads.append([p.grad for p in self.model.parameters()])
        for i, p in enumerate(self.model.parameters()):
            total = grads[0][i]
            for r in range(1, self.world):
                total = total + grads[r][i]
            p.grad = total / self.world
        return losses

    def step(self, step, clip=None):
        losses = self.average_grads(*batch(step))
        norm = None
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.opt.step()
        return losses, norm


def same(got, want, what):
    if not torch.equal(got, want):
        diff = (got != want).reshape(-1).nonzero()[0].item()
        raise AssertionError(f"{what}: not bitwise equal; first difference at {diff}: "
                             f"{got.reshape(-1)[diff].item()!r} vs {want.reshape(-1)[diff].item()!r}")


def wrapped(stage, rank, **kwargs):
    torch.manual_seed(SEED + rank)
    return parallel.FullyShardedDataParallel(
        make(), stage=stage, wrap_policy=parallel.module_type_policy(nn.Linear), **kwargs)


def parity(stage, steps, rank, world):
    model = wrapped(stage, rank)
    assert len(model.units()) == 4, model.units()
    opt = optimizer(model.parameters())
    ref = Reference(world)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(shard(x, rank, world)), shard(y, rank, world))
        loss.backward()
        opt.step()
        want, _ = ref.step(step)
        same(loss.detach(), want[rank], f"stage {stage}, step {step}: loss")
    state = model.full_state_dict()
    for k, v in ref.model.state_dict().items():
        same(state[k], v, f"stage {stage}: {k} after {steps} steps")
    return len(state)


def extra_clip(rank, world, x, y):
    # clip_grad_norm_ over the shards against the reference's global norm.
    model = wrapped(3, rank)
    opt = optimizer(model.parameters())
    ref = Reference(world)
    nn.functional.mse_loss(model(shard(x, rank, world)), shard(y, rank, world)).backward()
    norm = model.clip_grad_norm_(0.05)
    opt.step()
    _, want = ref.step(0, clip=0.05)
    torch.testing.assert_close(norm, want, msg=lambda m: f"clip_grad_norm_: {m}")
    state = model.full_state_dict()
    for k, v in ref.model.state_dict().items():
        torch.testing.assert_close(state[k], v, msg=lambda m: f"after clipping, {k}: {m}")


def extra_bf16(rank, world, x, y):
    # bf16 compute over fp32 master weights.
    mixed = wrapped(3, rank, mixed_precision=parallel.MixedPrecision(torch.bfloat16))
    loss = nn.functional.mse_loss(mixed(shard(x, rank, world)).float(), shard(y, rank, world))
    loss.backward()
    fresh = Reference(world)
    want, _ = fresh.step(0)
    torch.testing.assert_close(loss.detach(), want[rank], rtol=1.6e-2, atol=1e-5,
                               msg=lambda m: f"bf16 loss: {m}")
    assert all(p.dtype == torch.float32 and p.grad is not None for p in mixed.parameters())


def extra_offload(rank, world, x, y):
    # CPU offload changes where the master and optimizer state live (and the
    # modelled time), not the arithmetic: the same losses bitwise, and each
    # step after the first charges the host traffic to the compute clock.
    losses, charged = [], []
    for offload in (None, parallel.CPUOffload(host_gbps=1.0)):
        model = wrapped(3, rank, cpu_offload=offload)
        opt = optimizer(model.parameters())
        run_losses = []
        for step in range(2):
            opt.zero_grad(set_to_none=True)
            before = torchneuron.fabric.clock()["compute_us"]
            loss = nn.functional.mse_loss(model(shard(x, rank, world)), shard(y, rank, world))
            charged.append(torchneuron.fabric.clock()["compute_us"] - before)
            loss.backward()
            opt.step()
            run_losses.append(loss.detach())
        losses.append(run_losses)
    for a, b in zip(*losses):
        same(b, a, "cpu offload: loss")
    assert charged[3] > charged[1], charged


def extra_checkpointing(rank, world, x, y):
    # Activation checkpointing (non-reentrant) inside ZeRO-3 units: the
    # recomputed forwards run during backward; gradients are unchanged.
    class Checkpointed(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            for layer in self.inner:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) \
                    if isinstance(layer, nn.Linear) else layer(x)
            return x

    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(SEED)
        inner = make()
        net = parallel.FullyShardedDataParallel(
            Checkpointed(inner) if checkpointed else inner, stage=3,
            wrap_policy=parallel.module_type_policy(nn.Linear))
        nn.functional.mse_loss(net(shard(x, rank, world)), shard(y, rank, world)).backward()
        grads.append([q.grad for q in net.parameters()])
    for a, b in zip(*grads):
        same(b, a, "activation checkpointing: shard gradient")


def extra_state_dict(rank, world):
    # Round trip of a full state dict, and a mismatch named.
    target = Reference(world).model.state_dict()
    other = wrapped(2, rank)
    other.load_full_state_dict(target)
    for k, v in other.full_state_dict().items():
        same(v, target[k], f"load_full_state_dict: {k}")
    bad = dict(target)
    bad["3.weight"] = torch.zeros(HIDDEN + 1, HIDDEN)
    try:
        other.load_full_state_dict(bad)
        raise AssertionError("a mismatched state dict loaded")
    except ValueError as e:
        assert "3.weight has shape [20, 20] in the model but [21, 20] in the state dict" in str(e), e


def extras(rank, world):
    x, y = batch(0)
    extra_clip(rank, world, x, y)
    extra_bf16(rank, world, x, y)
    extra_offload(rank, world, x, y)
    extra_checkpointing(rank, world, x, y)
    extra_state_dict(rank, world)


def no_sync(stage, rank, world):
    """Two microbatches per rank, the first inside no_sync(): the unit reduces
    once, the sum of both; equal bitwise to DDP's no_sync (each rank's .grad
    accumulating both, then the rank-order sum over ranks / world)."""
    model = wrapped(stage, rank)
    opt = optimizer(model.parameters())
    ref = Reference(world)
    x, y = batch(0)
    mine_x, mine_y = shard(x, rank, world), shard(y, rank, world)
    half = mine_x.shape[0] // 2
    group = model.process_group
    # An accumulation abandoned and discarded by zero_grad() leaves no trace.
    with model.no_sync():
        nn.functional.mse_loss(model(mine_x * 3), mine_y).backward()
    model.zero_grad()
    before = len(torchneuron.fabric.records(group))
    with model.no_sync():
        nn.functional.mse_loss(model(mine_x[:half]), mine_y[:half]).backward()
    inside = [r["op"] for r in torchneuron.fabric.records(group)[before:]]
    assert not any("reduce" in op for op in inside), f"stage {stage}: no_sync reduced: {inside}"
    nn.functional.mse_loss(model(mine_x[half:]), mine_y[half:]).backward()
    opt.step()
    ref.average_grads(x, y, (slice(0, half), slice(half, None)))
    ref.opt.step()
    state = model.full_state_dict()
    for k, v in ref.model.state_dict().items():
        same(state[k], v, f"no_sync stage {stage}: {k}")


def policies_and_prefetch(rank, world):
    # size_policy wraps the outermost submodules with enough parameters:
    # only the 20x20 Linear (420) reaches 300.
    sized = parallel.FullyShardedDataParallel(make(), stage=1,
                                              wrap_policy=parallel.size_policy(300))
    assert [(name, params) for name, params, _ in sized.units()] == \
        [("3", ["3.weight", "3.bias"]),
         ("", ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"])], sized.units()

    # Prefetch: once the forward order is known, entering unit i's forward
    # has started unit i+1's all-gather; without prefetch nothing is in
    # flight. The arithmetic is the same either way.
    x, y = batch(0)
    losses = []
    for prefetch in (True, False):
        model = wrapped(3, rank, prefetch=prefetch)
        units = model._units
        seen = []
        linears = [m for m in model.module if isinstance(m, nn.Linear)]
        for unit_module, following in zip(linears, units[1:]):
            unit_module.register_forward_pre_hook(
                lambda m, inputs, f=following: seen.append(f.core.gathering or f.core.gathered))
        run = []
        opt = optimizer(model.parameters())
        for step in range(2):
            seen.clear()
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(shard(x, rank, world)), shard(y, rank, world))
            loss.backward()
            opt.step()
            run.append(loss.detach())
        assert seen == [prefetch] * (len(units) - 1), (prefetch, seen)
        losses.append(run)
    for a, b in zip(*losses):
        same(b, a, "prefetch off: loss")

    # A bf16 gradient reduction: the shard gradients are kept in bf16 and
    # are the fp32 average within bf16's precision.
    model = wrapped(2, rank, mixed_precision=parallel.MixedPrecision(reduce_dtype=torch.bfloat16))
    nn.functional.mse_loss(model(shard(x, rank, world)), shard(y, rank, world)).backward()
    ref = Reference(world)
    ref.average_grads(x, y)
    average = {n: p.grad for n, p in ref.model.named_parameters()}
    for unit in model._all_units():
        assert unit.core.shard.grad.dtype == torch.bfloat16
        for name, got in zip(unit.param_names,
                             unit.core.unshard(unit.core.shard.grad.float())):
            torch.testing.assert_close(got, average[name], rtol=1.6e-2, atol=1e-3,
                                       msg=lambda m: f"bf16 reduction: {name}: {m}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", default="123")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    env = job.start()
    rank, world = env.rank, env.world_size
    assert BATCH % world == 0
    for stage in map(int, args.stages):
        tensors = parity(stage, args.steps, rank, world)
        if rank == 0:
            print(f"zero parity stage {stage}: {args.steps} steps x {world} ranks: losses and "
                  f"{tensors} tensors bitwise equal to the reference", flush=True)
    extras(rank, world)
    for stage in (1, 2, 3):
        no_sync(stage, rank, world)
    policies_and_prefetch(rank, world)
    dist.barrier()
    if rank == 0:
        print("zero extras: clip_grad_norm_, bf16 mixed precision, cpu offload, activation "
              "checkpointing, full state dict round trip: ok", flush=True)
        print("zero no_sync at stages 1-3 bitwise equal to DDP's; size policy, prefetch, bf16 "
              "reduction: ok", flush=True)


if __name__ == "__main__":
    main()
