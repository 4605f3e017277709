#!/usr/bin/env python3
"""Pipeline bubble on modelled time against the schedules' and the formula.

    .venv/bin/python benchmarks/pipeline_bubble.py [--build build] [--stages 2 4]

For each stage count p the driver runs `neuronrun -n p` on this script in
worker mode: a GPT (4 blocks per stage, hidden 256, sequence 64, vocabulary
512, partitioned by the device model's cost of each layer) takes 2 training
steps per schedule and microbatch count; the second step's figures are
reported. "measured" is stage 0's idle share of its modelled step time
(1 - charged compute / clock advance: waiting for the other stages, which
includes the modelled stage-to-stage transfers); "schedule" is the bubble of
the schedule's own simulation (forward 1, backward 2, no transfer time);
"formula" is (p-1)/(m+p-1), or (p-1)/(v m) interleaved.
"""
import datetime
import sys

import bench_jobs

CASES = [("gpipe", 1, 4), ("gpipe", 1, 8), ("1f1b", 1, 4), ("1f1b", 1, 8), ("1f1b", 1, 16),
         ("interleaved", 2, 8), ("interleaved", 2, 16)]


def worker():
    import torch
    import torch.distributed as dist

    import torchneuron
    import torchneuron.parallel as parallel
    from torchneuron.models.gpt import GPT, GPTConfig
    from torchneuron.parallel import pipeline

    torch.set_num_threads(1)
    torchneuron.init(timeout=datetime.timedelta(seconds=600))
    p = dist.get_world_size()
    parallel.initialize(pp=p)
    for schedule, v, m in CASES:
        cfg = GPTConfig(vocab_size=512, seq_len=64, dim=256, heads=4, layers=4 * p)
        torch.manual_seed(0)
        model = GPT(cfg)
        layers = model.stages()
        tokens = m * 64  # one sequence per microbatch
        costs = [max(1e-3, pipeline.device_forward_us(layer, torch.zeros(tokens, 1)))
                 for layer in layers]
        chunks = pipeline.partition(layers, v, costs=costs)
        engine = parallel.PipelineEngine(chunks, model.loss, m, schedule)
        x = torch.randint(0, cfg.vocab_size, (m, cfg.seq_len))
        for _ in range(2):
            engine.step(x, x)
        if dist.get_rank() == 0:
            b = engine.last
            print(f"bubble {p} {schedule} {v} {m} {b['bubble']:.4f} {b['schedule_bubble']:.4f} "
                  f"{b['formula_bubble']:.4f} {b['modelled_step_us']:.1f}", flush=True)
        dist.barrier()
    return 0


def main():
    args = bench_jobs.driver_args(__doc__.splitlines()[0], "--stages", [2, 4],
                                  "pipeline stage counts (one job each)")
    if args.worker:
        return worker()
    print(f"{'p':>2} {'schedule':>11} {'v':>2} {'m':>3} | {'measured':>8} {'schedule':>8} "
          f"{'formula':>8} | {'step us':>9}")
    for p in args.stages:
        for pp, schedule, v, m, measured, sched, formula, step in \
                bench_jobs.worker_rows(args.build, p, __file__, "bubble"):
            print(f"{pp:>2} {schedule:>11} {v:>2} {m:>3} | {float(measured):>8.3f} "
                  f"{float(sched):>8.3f} {float(formula):>8.3f} | {float(step):>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
