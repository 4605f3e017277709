#!/usr/bin/env python3
"""A small decoder of a configs/models-style file trained for real on
"neuron", eagerly, with the step `neuronrun predict` captures: microbatches
of gradient accumulation, then the gradients all-reduced over the
data-parallel group in one fp32 bucket, the gradient norm all-reduced, and
AdamW over the flat parameters (torchneuron.predict.step's update). Each
rank records its operation trace (--trace-out) for `neuronrun replay`: the
real path that predict's figures are held against (tests/python/test_predict.py).

    neuronrun -n 4 tests/python/scripts/decoder_step.py --model M --tp 2 \\
        --seq 32 --microbatches 2 --trace-out DIR
"""
import argparse

import torch
import torch.distributed as dist

import torchneuron.fabric as fabric
import torchneuron.parallel as parallel
from torchneuron.models.decoder import Decoder, load_config
from torchneuron.predict.step import _adamw

import job  # tests/python/scripts/job.py: the shared job start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--attention", default="core")
    p.add_argument("--trace-out", required=True)
    args = p.parse_args()
    job.start()
    parallel.initialize(tp=args.tp)
    dp_group = parallel.mesh.get_data_parallel_group()
    cfg = load_config(args.model)
    torch.manual_seed(0)
    model = Decoder(cfg, attention=args.attention).to("neuron")
    params = [q for q in model.parameters()]
    n = sum(q.numel() for q in params)
    state = [torch.zeros(n, device="neuron") for _ in range(2)]
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, cfg.vocab, (2, args.micro_batch, args.seq), generator=g)
            .to("neuron") for _ in range(args.microbatches)]
    fabric.start_trace()
    for _ in range(args.steps):
        fabric.mark("step_begin")
        for tokens, targets in data:
            model(tokens, targets).backward()
        flat = torch.cat([q.grad.reshape(-1) for q in params])
        dist.all_reduce(flat, group=dp_group)
        norm = torch.linalg.vector_norm(flat)
        dist.all_reduce(norm.reshape(1), group=dp_group)
        flat.mul_((1.0 / (norm + 1e-6)).clamp(max=1.0))
        weights = torch.cat([q.detach().reshape(-1) for q in params])
        _adamw(weights, flat, state[0], state[1])
        fabric.mark("step_end")
        for q in params:
            q.grad = None
    fabric.save_trace(args.trace_out)
    if dist.get_rank() == 0:
        print(f"decoder_step: {n} parameters per rank, {args.steps} steps traced")


if __name__ == "__main__":
    main()
