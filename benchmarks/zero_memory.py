#!/usr/bin/env python3
"""ZeRO model-state memory per rank against the ZeRO paper's formulas.

    .venv/bin/python benchmarks/zero_memory.py [--build build] [--ranks 4 8]

For each data-parallel size N the driver runs `neuronrun -n N` on this
script in worker mode: a GPT of 32 blocks (hidden 64, vocabulary 256; psi
parameters) wrapped in FullyShardedDataParallel with a unit per block, bf16
parameters and gradients over fp32 master weights (MixedPrecision(bfloat16,
bfloat16)), AdamW; per ZeRO stage, the peak model-state memory of rank 0
during its second step (torchneuron.parallel.model_state_memory: master
shard, gathered parameters, full and shard gradients, optimizer state; not
activations) against the formulas with K = 12 bytes of optimizer state per
parameter: stage 1 4psi + 12psi/N, stage 2 2psi + 14psi/N, stage 3 16psi/N;
and stage 3 with CPUOffload ("3o": master shards, their gradients and the
optimizer state in host memory; no formula: what stays on the device is the
working set of gathered parameters and gradients in flight).
"""
import datetime
import gc
import sys

import bench_jobs

FORMULA = {"1": lambda psi, n: 4 * psi + 12 * psi / n,
           "2": lambda psi, n: 2 * psi + 14 * psi / n,
           "3": lambda psi, n: 16 * psi / n,
           "3o": lambda psi, n: 0}


def worker():
    import torch
    import torch.distributed as dist

    import torchneuron
    import torchneuron.parallel as parallel
    from torchneuron.models.gpt import GPT, Block, GPTConfig

    torch.set_num_threads(1)
    torchneuron.init(timeout=datetime.timedelta(seconds=600))
    n = dist.get_world_size()
    cfg = GPTConfig(vocab_size=256, seq_len=16, dim=64, heads=4, layers=32)
    for case in FORMULA:
        offload = case.endswith("o")
        torch.manual_seed(0)
        model = GPT(cfg, tp_group=False)
        psi = sum(p.numel() for p in model.parameters())
        zero = parallel.FullyShardedDataParallel(
            model, stage=int(case[0]), wrap_policy=parallel.module_type_policy(Block),
            mixed_precision=parallel.MixedPrecision(torch.bfloat16, torch.bfloat16),
            cpu_offload=parallel.CPUOffload() if offload else None)
        opt = torch.optim.AdamW(zero.parameters(), lr=1e-3)
        x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
        for step in range(2):
            if step == 1:
                parallel.reset_model_state_peak()
            opt.zero_grad(set_to_none=True)
            zero(x, x).backward()
            opt.step()
            parallel.record_optimizer_state(opt, offloaded=offload)
        peak = parallel.model_state_memory()["peak"]
        if dist.get_rank() == 0:
            print(f"zero_memory {n} {case} {psi} {peak} {FORMULA[case](psi, n):.0f}", flush=True)
        del zero, opt, model
        gc.collect()
        dist.barrier()
    return 0


def main():
    args = bench_jobs.driver_args(__doc__.splitlines()[0], "--ranks", [4, 8],
                                  "data-parallel rank counts (one job each)")
    if args.worker:
        return worker()
    print(f"{'N':>3} {'stage':>5} {'psi':>9} | {'measured MiB':>12} {'formula MiB':>11} "
          f"{'ratio':>6}")
    worst = 0.0
    for n in args.ranks:
        for size, stage, psi, peak, formula in \
                bench_jobs.worker_rows(args.build, n, __file__, "zero_memory"):
            if float(formula) == 0:  # no formula for offload
                print(f"{size:>3} {stage:>5} {int(psi):>9} | {int(peak) / 2**20:>12.3f} "
                      f"{'-':>11} {'-':>6}")
                continue
            ratio = float(peak) / float(formula)
            worst = max(worst, abs(ratio - 1))
            print(f"{size:>3} {stage:>5} {int(psi):>9} | {int(peak) / 2**20:>12.3f} "
                  f"{float(formula) / 2**20:>11.3f} {ratio:>6.3f}")
    print(f"\nlargest deviation from the formulas: {worst:.1%} (target: within 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
