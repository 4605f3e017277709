#!/usr/bin/env python3
"""Tensor (and sequence) parallel parity: torchneuron.models.gpt.GPT split
over a tensor-parallel group against the same GPT on one device.

    neuronrun -n 4 tests/python/scripts/tp_parity.py --tp 2 [--sp]

Both models are built from the same seed (the parallel layers initialise
full weights and keep their slices, so they start equal: checked), get the
same batch on every rank, and take 3 SGD steps. Per step, within the fp32
assert_close defaults: the loss, and every gradient (a split parameter's
against the matching slice of the reference's, the vocabulary padded).
The vocabulary (51) is not divisible by the tensor-parallel size, so the
padded vocab-parallel cross-entropy is exercised. Also: the RNG tracker's
default stream is equal on the ranks of a tensor-parallel group and its
fork differs, and dropout outside the tensor-parallel regions drops what
the one-device model drops (with --sp too: each rank keeps its slice of the
whole sequence's mask). Rank 0 prints one summary line.
"""
import argparse

import torch
import torch.distributed as dist

import torchneuron  # noqa: F401
import torchneuron.parallel as parallel
from torchneuron.models.gpt import GPT, GPTConfig
from torchneuron.parallel import tensor_parallel as tp

import job  # tests/python/scripts/job.py: the shared job start

CFG = GPTConfig(vocab_size=51, seq_len=8, dim=32, heads=4, layers=2)


def close(got, want, what):
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--sp", action="store_true", help="sequence parallel")
    args = p.parse_args()
    rank = job.start().rank
    parallel.initialize(tp=args.tp)

    torch.manual_seed(11)
    ref = GPT(CFG, tp_group=False)
    torch.manual_seed(11)
    model = GPT(CFG, sequence_parallel=args.sp)
    pairs = list(zip(model.named_parameters(), ref.parameters()))
    assert len(pairs) == len(list(ref.parameters()))
    for (name, mine), full in pairs:
        close(mine.detach(), tp.local_part(full.detach(), mine), f"initial {name}")

    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    targets = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ref))
    checks = 0
    for step in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        loss, want = model(tokens, targets), ref(tokens, targets)
        close(loss, want, f"step {step}: loss")
        loss.backward()
        want.backward()
        tp.allreduce_sequence_parallel_grads(model)
        for (name, mine), full in pairs:
            close(mine.grad, tp.local_part(full.grad, mine), f"step {step}: {name}.grad")
            checks += 1
        opt.step()
        ref_opt.step()

    # Dropout outside the tensor-parallel regions draws from the default RNG,
    # equal on the tensor-parallel ranks: with the same seed the split model
    # drops exactly what the one-device model drops.
    import dataclasses
    cfg = dataclasses.replace(CFG, dropout=0.2, attention_dropout=0.0)
    torch.manual_seed(11)
    ref = GPT(cfg, tp_group=False)
    torch.manual_seed(11)
    model = GPT(cfg, sequence_parallel=args.sp)
    ref.train()
    model.train()
    for step in range(2):
        torch.manual_seed(100 + step)
        want = ref(tokens, targets)
        torch.manual_seed(100 + step)
        close(model(tokens, targets), want, f"dropout step {step}: loss")

    tp.manual_seed(5)
    group = parallel.get_tensor_parallel_group()
    default = torch.rand(4)
    with tp.get_rng_tracker().fork():
        forked = torch.rand(4)
    after = torch.rand(4)
    for t, want_equal in ((default, True), (forked, False), (after, True)):
        out = [torch.zeros(4) for _ in range(args.tp)]
        dist.all_gather(out, t, group=group)
        assert all(torch.equal(o, out[0]) for o in out) == want_equal, (t, out)
    dist.barrier()
    if rank == 0:
        print(f"tp parity tp={args.tp} sp={args.sp}: 3 steps, losses and {checks} gradients "
              f"close to one device; rng tracker and dropout ok", flush=True)


if __name__ == "__main__":
    main()
