#!/usr/bin/env python3
"""Pipeline (and 3D) parity: torchneuron.models.gpt.GPT split into pipeline
stages (and tensor-parallel within them) against the same GPT on one device.

    neuronrun -n 4 tests/python/scripts/pp_parity.py --pp 2 [--tp 2] [--schedule 1f1b]
                                                      [--chunks 1] [--microbatches 3] [--zero S]
                                                      [--sp] [--clip MAX_NORM]
    neuronrun -n 8 tests/python/scripts/pp_parity.py --pp 2 --tp 2 --zero 1,3 --sp --clip 0.05  # 3D: dp 2

Both models come from the same seed; the pipeline engine runs the batch as
microbatches (a count that need not divide the batch evenly, nor be a
multiple of the stages) and the reference the whole batch. Data-parallel
ranks each take their share of the batch; their gradients are averaged
(average_gradients), or with --zero each chunk is a FullyShardedDataParallel
unit of that stage. For 3 SGD steps, within the fp32 assert_close defaults:
the loss (last stage, averaged over data parallel) and the gradient of every
parameter a rank holds (with --zero: ZeRO's shards hold no per-parameter
gradients, so then the losses are compared, and the parameters after the
last step). --sp makes the tensor-parallel regions sequence parallel (the
LayerNorms' gradients summed over the tensor-parallel group: by
allreduce_sequence_parallel_grads, or by the sharded units' hooks under
--zero). --clip clips with torchneuron.parallel.clip_grad_norm_ over every
part of the model and checks its norm against the one-device model's
(torch.nn.utils.clip_grad_norm_), which must exceed MAX_NORM so the
gradients really are scaled. Rank 0 prints one line, with the
first stage's modelled bubble next to the schedule's and the formula's.
"""
import argparse

import torch
import torch.distributed as dist

import torchneuron  # noqa: F401
import torchneuron.parallel as parallel
from torchneuron.models.gpt import GPT, GPTConfig
from torchneuron.parallel import pipeline, tensor_parallel as tp

import job  # tests/python/scripts/job.py: the shared job start

CFG = GPTConfig(vocab_size=40, seq_len=8, dim=32, heads=4, layers=4)
BATCH = 7


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--chunks", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=3)
    p.add_argument("--zero", type=_stages, default=[0],
                   help="ZeRO stage, or stages run one after the other in the same job "
                        "(e.g. 1,3)")
    p.add_argument("--sp", action="store_true", help="sequence parallel")
    p.add_argument("--clip", type=float, help="clip the global gradient norm to this")
    return p.parse_args()


def _stages(text):
    stages = [int(s) for s in text.split(",")]
    if not stages or any(s not in (0, 1, 2, 3) for s in stages):
        raise argparse.ArgumentTypeError(f"--zero {text}: stages are 0, 1, 2 or 3")
    return stages


def check_zero_state(parts, ref, model):
    """Each ZeRO unit's full parameters against the reference's after the
    steps; returns the number of tensors checked."""
    checks = 0
    full = dict(ref.named_parameters())
    prefix = {id(q): n for n, q in model.named_parameters()}
    for part in parts:
        state = part.full_state_dict()
        for (key, value), q in zip(state.items(), part.module.parameters()):
            torch.testing.assert_close(value, tp.local_part(full[prefix[id(q)]].detach(), q),
                                       msg=lambda m: f"after 3 steps: {key}: {m}")
            checks += 1
    return checks


def main():
    args = parse()
    rank = job.start().rank
    parallel.initialize(tp=args.tp, pp=args.pp)
    for zero in args.zero:
        run(args, zero, rank)


def run(args, zero, rank):
    """Trains the pipeline with ZeRO stage `zero` (0: none) and the
    reference for 3 steps, checking them; rank 0 prints the line."""
    torch.manual_seed(11)
    ref = GPT(CFG, tp_group=False)
    torch.manual_seed(11)
    model = GPT(CFG, sequence_parallel=args.sp)
    chunks = pipeline.partition(model.stages(), args.chunks)
    layout = parallel.get_layout()
    parts = [parallel.FullyShardedDataParallel(c, stage=zero) for c in chunks] \
        if zero else chunks
    engine = parallel.PipelineEngine(parts, model.loss, args.microbatches, args.schedule)
    mine = {id(q) for c in chunks for q in c.parameters()}
    pairs = [(n, q, r) for (n, q), r in zip(model.named_parameters(), ref.parameters())
             if id(q) in mine]
    opt = torch.optim.SGD([q for part in parts for q in part.parameters()], lr=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(5)
    batch = BATCH * layout.dp
    tokens = torch.randint(0, CFG.vocab_size, (batch, CFG.seq_len), generator=g)
    targets = torch.randint(0, CFG.vocab_size, (batch, CFG.seq_len), generator=g)
    share = slice(layout.dp_rank * BATCH, (layout.dp_rank + 1) * BATCH)
    checks = 0
    for step in range(3):
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = engine.step(tokens[share], targets[share])
        if not zero:
            parallel.average_gradients([q for _, q, _ in pairs])
            if args.sp:
                tp.allreduce_sequence_parallel_grads(model)
        want = ref(tokens, targets)
        want.backward()
        if args.clip is not None:
            norm = parallel.clip_grad_norm_(parts, args.clip)
            ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), args.clip)
            torch.testing.assert_close(norm, ref_norm,
                                       msg=lambda m: f"step {step}: gradient norm: {m}")
            assert ref_norm > args.clip, f"norm {ref_norm} does not exceed --clip {args.clip}"
            checks += 1
        if engine.is_last:
            mean = loss.detach().reshape(1)
            dist.all_reduce(mean, group=parallel.get_data_parallel_group())
            torch.testing.assert_close(mean[0] / layout.dp, want.detach(),
                                       msg=lambda m: f"step {step}: loss: {m}")
            checks += 1
        if not zero:
            for name, q, r in pairs:
                torch.testing.assert_close(q.grad, tp.local_part(r.grad, q),
                                           msg=lambda m: f"step {step}: {name}.grad: {m}")
                checks += 1
        opt.step()
        ref_opt.step()
    if zero:
        checks += check_zero_state(parts, ref, model)
    counts = torch.tensor([checks])
    dist.all_reduce(counts)
    dist.barrier()
    if rank == 0:
        b = engine.last
        print(f"pp parity pp={args.pp} tp={args.tp} dp={layout.dp} zero={zero} "
              f"sp={args.sp} clip={args.clip} {args.schedule} chunks={args.chunks} microbatches={args.microbatches}: ok, {int(counts)} checks close to one device; "
              f"stage 0 modelled bubble {b['bubble']:.3f} (schedule {b['schedule_bubble']:.3f}, "
              f"formula {b['formula_bubble']:.3f})", flush=True)


if __name__ == "__main__":
    main()
