#!/usr/bin/env python3
"""Save in one layout, load in another, continue: equals an uninterrupted run.

    neuronrun -n 4 tests/python/scripts/reshard_parity.py --dir DIR

Phase A: tp=2 x dp=2, ZeRO-3 (a unit per block), AdamW, 3 steps, then
save_checkpoint (parameters and sharded optimizer state). Phase B: a new
GPT from another seed in tp=1 x pp=2 x dp=2 (1F1B, 2 microbatches,
gradients averaged over data parallel), load_checkpoint, 3 more steps.
Phase C: the same checkpoint loaded into tp=1 x dp=4 with ZeRO-2, 3 more
steps. The vocabulary (41) is padded at tp=2. The reference: the same GPT
on one device, 6 AdamW steps on the whole batch.
Every step's loss (averaged over the data-parallel ranks, each of which
trains on half the batch) within the fp32 assert_close defaults. Rank 0
prints one line.
"""
import argparse

import torch
import torch.distributed as dist

import torchneuron  # noqa: F401
import torchneuron.parallel as parallel
from torchneuron.models.gpt import GPT, Block, GPTConfig
from torchneuron.parallel import pipeline

import job  # tests/python/scripts/job.py: the shared job start

CFG = GPTConfig(vocab_size=41, seq_len=8, dim=32, heads=4, layers=2)  # 41: padded at tp 2
BATCH = 8


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randint(0, CFG.vocab_size, (BATCH, CFG.seq_len), generator=g),
            torch.randint(0, CFG.vocab_size, (BATCH, CFG.seq_len), generator=g))


def half(t):
    layout = parallel.get_layout()
    n = BATCH // layout.dp
    return t[layout.dp_rank * n:(layout.dp_rank + 1) * n]


def dp_mean(loss):
    t = loss.detach().clone().reshape(1)
    dist.all_reduce(t, group=parallel.get_data_parallel_group())
    return t[0] / parallel.get_layout().dp


def optimizer(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def train(zero, opt, steps, want, phase):
    """Steps of a data-parallel (sharded) model, each loss against want[step]."""
    for step in steps:
        opt.zero_grad()
        tokens, targets = batch(step)
        loss = zero(half(tokens), half(targets))
        loss.backward()
        opt.step()
        torch.testing.assert_close(dp_mean(loss), want[step],
                                   msg=lambda m: f"phase {phase} step {step}: loss: {m}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    rank = job.start().rank

    torch.manual_seed(3)
    ref = GPT(CFG, tp_group=False)
    ref_opt = optimizer(ref.parameters())
    want = []
    for step in range(6):
        ref_opt.zero_grad()
        loss = ref(*batch(step))
        loss.backward()
        ref_opt.step()
        want.append(loss.detach())

    parallel.initialize(tp=2)
    torch.manual_seed(3)
    model = GPT(CFG)
    zero = parallel.FullyShardedDataParallel(model, stage=3,
                                             wrap_policy=parallel.module_type_policy(Block))
    opt = optimizer(zero.parameters())
    train(zero, opt, range(3), want, "A")
    parallel.save_checkpoint(args.dir, model, [zero], opt, step=3)

    parallel.destroy()
    parallel.initialize(tp=1, pp=2)
    torch.manual_seed(999)  # another start: the checkpoint must replace it
    model = GPT(CFG)
    chunks = pipeline.partition(model.stages())
    params = [q for c in chunks for q in c.parameters()]
    opt = optimizer(params)
    assert parallel.load_checkpoint(args.dir, model, chunks, opt) == 3
    engine = parallel.PipelineEngine(chunks, model.loss, microbatches=2)
    for step in range(3, 6):
        opt.zero_grad()
        tokens, targets = batch(step)
        loss = engine.step(half(tokens), half(targets))
        parallel.average_gradients(params)
        opt.step()
        if engine.is_last:
            torch.testing.assert_close(dp_mean(loss), want[step],
                                       msg=lambda m: f"phase B step {step}: loss: {m}")

    # Phase C: the same checkpoint into data parallelism over all 4 ranks
    # with ZeRO-2 (the sharded optimizer state re-split 4 ways).
    parallel.destroy()
    parallel.initialize(tp=1, pp=1)
    torch.manual_seed(998)
    model = GPT(CFG)
    zero = parallel.FullyShardedDataParallel(model, stage=2,
                                             wrap_policy=parallel.module_type_policy(Block))
    opt = optimizer(zero.parameters())
    assert parallel.load_checkpoint(args.dir, model, [zero], opt) == 3
    train(zero, opt, range(3, 6), want, "C")
    dist.barrier()
    if rank == 0:
        print("reshard parity: tp=2 dp=2 ZeRO-3 -> checkpoint -> tp=1 pp=2 dp=2 and tp=1 dp=4 "
              "ZeRO-2: 9 losses close to an uninterrupted run on one device", flush=True)


if __name__ == "__main__":
    main()
