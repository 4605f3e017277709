#!/usr/bin/env python3
"""DDP parity: unchanged DistributedDataParallel (or torchneuron's own, with
--ddp torchneuron) on a backend against a single-process reference computed
on every rank.

    neuronrun -n 4 tests/python/scripts/ddp_parity.py [--backend neuron] [--tolerance bitwise|close]
                                                       [--ddp torch|torchneuron] [--cases abcde]
                                                       [--in-features N]

Each case builds a small fp32 model on every rank (from seed + rank, so DDP's
initial broadcast of rank 0's state matters), wraps it in DDP on the default
group of the backend, and trains it with SGD (momentum) on a global batch of
48 (divisible by 1, 2, 3, 4, 6, 8, 12, 16 ranks) split into contiguous shards,
rank r taking shard r. Every rank also
trains a reference copy that starts from rank 0's state: per step it computes
every shard's gradient the way rank r would (same mean loss, same gradient
accumulation), scales each as DDP 1.13's reducer does (x (1/W) while copying
into the bucket; an in-place / W when the grad already is the bucket view),
sums them in rank order 0, 1, ..., W-1 (a left fold in fp32: what a backend
whose allreduce reduces in rank order computes) and takes the SGD step.
torchneuron.parallel.DistributedDataParallel sums the unscaled gradients and
divides the sum by W once; with --ddp torchneuron the reference does so too.
Checked per step: the rank's loss against the reference's loss for shard r,
every gradient against the reference's; at the end every parameter, and
that all replicas are identical. Cases:
  (a) default DDP
  (b) gradient_as_bucket_view=True
  (c) no_sync(): two micro-batches per step, the first under no_sync
  (d) find_unused_parameters=True: one layer never used, one used on even
      steps only (DDP leaves a globally unused grad untouched)
  (e) broadcast_buffers=True with BatchNorm1d: ranks start with different
      running statistics; the module must see rank 0's buffers at every
      forward, and after it rank 0's buffers updated with the local shard's
      batch statistics (loss in train mode, per-shard batch statistics)
--in-features widens the input (first layer) for large gradients and buckets.
--tolerance bitwise (default) needs the rank-order sum; Gloo's ring sums in
another order, so check Gloo with --tolerance close (torch.testing.assert_close
with fp32 defaults). Rank 0 prints one line per case.
"""
import argparse
import contextlib
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

SEED, BATCH, STEPS, LR, MOMENTUM = 1234, 48, 10, 0.1, 0.9
SUM_THEN_DIVIDE = False  # how the DDP under test averages (set by --ddp)
IN, HIDDEN, OUT = 16, 32, 8


class MLP(nn.Module):
    def __init__(self, batchnorm=False):
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.bn = nn.BatchNorm1d(HIDDEN) if batchnorm else nn.Identity()
        self.fc2 = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


class Branchy(nn.Module):
    """A trunk, a branch used only when asked, and a layer never used."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(IN, HIDDEN)
        self.branch = nn.Linear(HIDDEN, HIDDEN)
        self.never = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUT)

    def forward(self, x, use_branch):
        h = torch.tanh(self.trunk(x))
        if use_branch:
            h = h + torch.tanh(self.branch(h))
        return self.head(h)


CASES = {
    "a": ("default DDP", MLP, {}),
    "b": ("gradient_as_bucket_view=True", MLP, {"gradient_as_bucket_view": True}),
    "c": ("no_sync(), two micro-batches per step", MLP, {}),
    "d": ("find_unused_parameters=True", Branchy, {"find_unused_parameters": True}),
    "e": ("broadcast_buffers=True, BatchNorm1d", lambda: MLP(batchnorm=True),
          {"broadcast_buffers": True}),
}


def batch(step, micro):
    g = torch.Generator().manual_seed(SEED * 1000 + step * 10 + micro)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def shard(t, r, world):
    n = BATCH // world
    return t[r * n:(r + 1) * n]


def bits(t):
    t = t.detach()
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t


class Checker:
    def __init__(self, tolerance, case):
        self.bitwise, self.case, self.count = tolerance == "bitwise", case, 0

    def same(self, got, want, what):
        where = f"case ({self.case}), {what}"
        if self.bitwise or not got.is_floating_point():
            if not torch.equal(bits(got), bits(want)):
                diff = (bits(got) != bits(want)).reshape(-1).nonzero()[0].item()
                raise AssertionError(
                    f"{where}: not bitwise equal; first difference at flat index {diff}: "
                    f"got {got.reshape(-1)[diff].item()!r}, expected "
                    f"{want.reshape(-1)[diff].item()!r}")
        else:
            torch.testing.assert_close(got, want, msg=lambda m: f"{where}: {m}")
        self.count += 1


def perturb_buffers(model, rank):
    """Rank-dependent running statistics, as if each rank had its own history."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.copy_(torch.linspace(-1, 1, m.num_features) * (rank + 1))
            m.running_var.fill_(1.0 + rank)
            m.num_batches_tracked.fill_(10 * rank)


def buffers(model):
    return [b.detach().clone() for b in model.buffers()]


def load_buffers(model, values):
    for b, v in zip(model.buffers(), values):
        b.copy_(v)


class Reference:
    """The single-process model every rank trains alongside its DDP replica."""

    def __init__(self, make, world, case):
        torch.manual_seed(SEED)  # rank 0's initial state
        self.model, self.world, self.case = make(), world, case
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        perturb_buffers(self.model, 0)
        self.rank0_buffers = buffers(self.model)
        self.used = set()
        for p in self.model.parameters():
            p.register_hook(lambda g, p=p: self.used.add(p))

    def step(self, step):
        """One step for every shard: returns losses[r][micro], buffers seen at r's
        forward and after it, and leaves the summed gradient in .grad."""
        params = list(self.model.parameters())
        self.opt.zero_grad(set_to_none=False)
        before = [p.grad for p in params]  # None until a param first has a grad
        losses, after_fwd, local, used = [], [], [], []
        for r in range(self.world):
            for p, g in zip(params, before):  # the state rank r's grads are in
                p.grad = None if g is None else torch.zeros_like(p)
            self.used.clear()
            losses.append([])
            load_buffers(self.model, self.rank0_buffers)  # DDP broadcasts rank 0's
            for micro in (0, 1) if self.case == "c" else (0,):
                x, y = batch(step, micro)
                out = self.forward(shard(x, r, self.world), step)
                loss = nn.functional.mse_loss(out, shard(y, r, self.world))
                loss.backward()
                losses[r].append(loss.detach())
            after_fwd.append(buffers(self.model))
            local.append([p.grad for p in params])
            used.append(set(self.used))
        seen = self.rank0_buffers
        self.rank0_buffers = after_fwd[0]  # rank 0 keeps its own; DDP broadcasts it next step
        for i, p in enumerate(params):
            if not any(p in u for u in used):  # globally unused: DDP leaves the grad untouched
                p.grad = before[i]
                continue
            # The grad is the bucket view (steps after the first with gradient_as_bucket_view):
            # the reducer divides in place; otherwise it multiplies by 1/W into the bucket.
            alias = self.case == "b" and before[i] is not None
            total = None
            for r in range(self.world):
                g = local[r][i] if local[r][i] is not None else torch.zeros_like(p)
                if not SUM_THEN_DIVIDE:
                    g = g / self.world if alias else g * (1.0 / self.world)
                total = g if total is None else total + g  # rank order: the backend's fold
            p.grad = total / self.world if SUM_THEN_DIVIDE else total
        return losses, seen, after_fwd

    def forward(self, x, step):
        return self.model(x, step % 2 == 0) if self.case == "d" else self.model(x)


def run_case(case, tolerance, rank, world):
    name, make, kwargs = CASES[case]
    torch.manual_seed(SEED + rank)  # a different initial state per rank: DDP broadcasts rank 0's
    model = make()
    ddp = DDP(model, **kwargs)
    if SUM_THEN_DIVIDE:  # our DDP creates no grads before the first backward either
        assert all(p.grad is None for p in model.parameters())
    perturb_buffers(model, rank)  # after DDP's initial sync: ranks now differ
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    ref = Reference(make, world, case)
    check = Checker(tolerance, case)
    seen = []
    model.register_forward_pre_hook(lambda m, inputs: seen.append(buffers(m)))

    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        ref_losses, ref_seen, ref_after = ref.step(step)
        seen.clear()
        micros = (0, 1) if case == "c" else (0,)
        for micro in micros:
            x, y = batch(step, micro)
            sync = ddp.no_sync() if micro < len(micros) - 1 else contextlib.nullcontext()
            with sync:
                args = (step % 2 == 0,) if case == "d" else ()
                out = ddp(shard(x, rank, world), *args)
                loss = nn.functional.mse_loss(out, shard(y, rank, world))
                if case == "e":
                    for b, want in zip(seen[-1], ref_seen):
                        check.same(b, want, f"step {step}: buffer seen by the forward vs rank 0's")
                    for b, want in zip(buffers(model), ref_after[rank]):
                        check.same(b, want, f"step {step}: buffer after the forward")
                loss.backward()
            check.same(loss.detach(), ref_losses[rank][micro], f"step {step} micro {micro}: loss")
        for (pname, p), q in zip(model.named_parameters(), ref.model.parameters()):
            if (p.grad is None) != (q.grad is None):
                raise AssertionError(f"case ({case}), step {step}: {pname}.grad is "
                                     f"{'None' if p.grad is None else 'set'}, the "
                                     f"reference's is {'None' if q.grad is None else 'set'}")
            if p.grad is not None:
                check.same(p.grad, q.grad, f"step {step}: {pname}.grad")
        opt.step()
        ref.opt.step()

    for (pname, p), q in zip(model.named_parameters(), ref.model.parameters()):
        check.same(p.detach(), q.detach(), f"after {STEPS} steps: {pname}")
    for pname, p in model.named_parameters():  # replicas identical, in either tolerance mode
        theirs = p.detach().clone()
        dist.broadcast(theirs, 0)
        if not torch.equal(bits(p), bits(theirs)):
            raise AssertionError(f"case ({case}): {pname} differs from rank 0's replica")
    dist.barrier()
    return name, check.count


def main():
    global DDP, SUM_THEN_DIVIDE, IN
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="neuron", help="torch.distributed backend (default neuron)")
    p.add_argument("--tolerance", choices=["bitwise", "close"], default="bitwise")
    p.add_argument("--cases", default="abcde", help="which cases to run (default abcde)")
    p.add_argument("--ddp", choices=["torch", "torchneuron"], default="torch",
                   help="whose DistributedDataParallel (default torch's)")
    p.add_argument("--in-features", type=int, default=IN,
                   help=f"input width (default {IN}); 8192 or more makes the first layer's "
                        "gradient 1 MiB or more (registered with NEURON_SHARED_TENSORS=1)")
    args = p.parse_args()
    IN = args.in_features
    if args.ddp == "torchneuron":
        import torchneuron.parallel
        DDP, SUM_THEN_DIVIDE = torchneuron.parallel.DistributedDataParallel, True
    if args.backend == "neuron":
        import torchneuron  # noqa: F401  registers the "neuron" backend
    torch.set_num_threads(1)  # the same kernels on every rank as in the reference
    dist.init_process_group(args.backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert BATCH % world == 0, f"the world size must divide the batch ({BATCH})"
    how = "bitwise equal to" if args.tolerance == "bitwise" else "assert_close to"
    for case in args.cases:
        name, checks = run_case(case, args.tolerance, rank, world)
        if rank == 0:
            print(f"{args.ddp} ddp parity ({case}) {name}: {STEPS} steps x {world} ranks, backend "
                  f"{args.backend}: ok, {checks} checks {how} the reference", flush=True)
    if args.backend == "neuron" and rank == 0:
        import torchneuron.fabric
        records = torchneuron.fabric.records()
        registered = sum(1 for r in records if r["registered"])
        print(f"registered allreduces: {registered} of {len(records)} collectives", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # torch 1.13: destroying a Gloo process group (in destroy_process_group(), or at exit
    # from DDP's Reducer) joins its worker threads while holding the GIL, and a worker just
    # freeing a finished Work's tensor needs the GIL: a deadlock. End without destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
