"""Example 04: a small GPT trained with data, ZeRO, tensor and pipeline
parallelism at once (what `make demo` runs).

    neuronrun -n 16 examples/04_train_gpt.py --tp 2 --pp 2 --zero 3    # dp = 16 / 4 = 4
    neuronrun -n 4 examples/04_train_gpt.py --dp 4                      # plain data parallel
    neuronrun -n 8 examples/04_train_gpt.py --tp 2 --pp 2 --sp          # + sequence parallel
    neuronrun -n 2 examples/04_train_gpt.py --compile                   # compiled blocks
    neuronrun -n 4 examples/04_train_gpt.py --pp 4 --schedule interleaved --layers 8

Ranks: tensor-parallel groups of --tp contiguous ranks, --pp pipeline
stages (1F1B over --microbatches; GPipe, or interleaved 1F1B with --chunks
model chunks per stage), data parallel over the rest (--dp, if given, must
agree): torchneuron.parallel.initialize. The data is a
synthetic token dataset sharded over the data-parallel ranks by
torchneuron.parallel.DistributedSampler. --zero 1/2/3 shards optimizer
state / gradients / parameters over data parallel
(FullyShardedDataParallel, a unit per transformer block); --zero 0
averages gradients (DistributedDataParallel, or after the pipeline step).
--clip clips the whole model's gradient norm (torchneuron.parallel.
clip_grad_norm_, across every axis of the layout).

Rank 0 prints per step: the loss; wall time per step and tokens/s on this
machine; the modelled step time and tokens/s on Trainium2 (device model for
the matmuls, fabric model for every collective and transfer, the slowest
rank's clock); and the largest resident memory of any rank. At the end it
prints every rank's memory: resident set and ZeRO model-state peak (the
sharded parameters, gradients and optimizer state). --metrics-out
FILE writes the run's figures (a RunFigures text proto) for `neuronrun matrix`;
--trace-out DIR records every rank's operation trace there, for
`neuronrun replay` on a larger topology (docs/scaling.md).
"""
import argparse
import datetime
import resource
import sys
import time

import torch
import torch.distributed as dist

import torchneuron
import torchneuron.parallel as parallel
from torchneuron import fabric, run_figures
from torchneuron.run_figures import collective_bytes, median
from torchneuron.models.gpt import GPT, Block, GPTConfig
from torchneuron.parallel import pipeline


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dp", type=int, default=0, help="data parallel (default: the rest)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--sp", action="store_true", help="sequence parallel (needs --tp > 1)")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline microbatches")
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved"])
    p.add_argument("--chunks", type=int, default=0,
                   help="model chunks per pipeline stage (default: 2 for interleaved, else 1)")
    p.add_argument("--clip", type=float, default=0.0,
                   help="clip the global gradient norm to this (0: no clipping)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile (backend \"neuron\") each transformer block")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="sequences per data-parallel rank")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics-out", help="write the run's figures to this file (a RunFigures "
                   "text proto; rank 0): what `neuronrun matrix` collects")
    p.add_argument("--trace-out", help="record each rank's operation trace into this "
                   "directory (rank_N.pb), for `neuronrun replay`")
    return p.parse_args()


def slowest(*values):
    """Each value's maximum over the ranks (one all-reduce)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def build(args):
    """The model, this rank's part of it (how its gradients are averaged),
    its parameters and the pipeline engine (None without --pp)."""
    cfg = GPTConfig(vocab_size=args.vocab, seq_len=args.seq, dim=args.dim, heads=args.heads,
                    layers=args.layers)
    parallel.tensor_parallel.manual_seed(args.seed)  # equal on tensor-parallel ranks
    model = GPT(cfg, sequence_parallel=args.sp)
    if args.compile:  # each transformer block: attention and MLP, forward and backward
        for block in model.blocks:
            block.compile(backend="neuron")
    per_stage = args.chunks or (2 if args.schedule == "interleaved" else 1)
    chunks = pipeline.partition(model.stages(), per_stage) if args.pp > 1 else [model]
    if args.zero:
        parts = [parallel.FullyShardedDataParallel(
            c, stage=args.zero,
            wrap_policy=parallel.module_type_policy(Block))
            for c in chunks]
    elif args.pp == 1:
        parts = [parallel.DistributedDataParallel(model)]
    else:
        parts = chunks
    params = [p for part in parts for p in part.parameters()]
    engine = None
    if args.pp > 1:
        engine = parallel.PipelineEngine(parts, model.loss, args.microbatches, args.schedule)
    return model, parts, params, engine


def train_step(args, model, parts, params, engine, opt, x, y):
    """One step: forward, backward, gradient averaging, clipping and the
    optimizer. Returns (loss, modelled compute us, bubble us, grad norm): the
    compute is what the device model charged over the step (compiled graphs
    charge their own modelled time, eager layers the estimate below)."""
    charged0 = fabric.clock()["charged_us"]
    opt.zero_grad(set_to_none=True)
    if engine is not None:
        loss = engine.step(x, y)
        # The engine's step less what was charged in it (compiled chunks
        # charge their own time, not through the engine's cost function).
        charged = fabric.clock()["charged_us"] - charged0
        bubble_us = max(0.0, engine.last["modelled_step_us"] - charged)
    else:
        loss = parts[0](x, y)
        loss.backward()
        # The device model's estimate of the eager forward and backward.
        fabric.advance_compute(3 * pipeline.device_forward_us(model, x))
        bubble_us = 0.0
    if args.sp and not args.zero:  # (the sharded units sum them themselves)
        parallel.tensor_parallel.allreduce_sequence_parallel_grads(model)
    if args.pp > 1 and not args.zero:
        parallel.average_gradients(params)
    norm = parallel.clip_grad_norm_(parts, args.clip).item() if args.clip else None
    opt.step()
    if args.zero:
        parallel.record_optimizer_state(opt)
    return loss, fabric.clock()["charged_us"] - charged0, bubble_us, norm


def report_step(args, layout, step, loss, start, clock0, compute_us, bubble_us, norm,
                tokens_per_step):
    """The slowest rank's figures of the step (one all-reduce) and the loss
    (it lives on the last stage: averaged over data parallel there); rank 0
    prints them. Returns (wall s, modelled us, compute us, bubble us, loss,
    max RSS MiB)."""
    wall, modelled_us, compute_us, bubble_us, rss = slowest(
        time.perf_counter() - start, fabric.clock()["compute_us"] - clock0, compute_us,
        bubble_us, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    value = torch.tensor([loss.item() if loss is not None else 0.0])
    dist.all_reduce(value)
    value /= layout.dp * layout.tp
    if dist.get_rank() == 0:
        print(f"step {step}: loss {value.item():.4f} | wall {wall * 1e3:.1f} ms, "
              f"{tokens_per_step / wall:,.0f} tokens/s | modelled {modelled_us:.1f} us, "
              f"{tokens_per_step / modelled_us * 1e6:,.0f} tokens/s | "
              f"max RSS {rss:.0f} MiB" +
              (f" | grad norm {norm:.4f} (clip {args.clip:g})" if norm is not None else ""),
              flush=True)
    return wall, modelled_us, compute_us, bubble_us, value.item(), rss


def main():
    args = parse()
    torch.set_num_threads(1)
    torchneuron.init(timeout=datetime.timedelta(seconds=300))
    layout = parallel.initialize(tp=args.tp, pp=args.pp, dp=args.dp or None)
    model, parts, params, engine = build(args)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    data = parallel.SyntheticTokenDataset(sequences=args.batch * layout.dp * args.steps,
                                          length=args.seq, vocab=args.vocab, seed=args.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch,
                                         sampler=parallel.DistributedSampler(data, seed=args.seed))
    tokens_per_step = args.batch * layout.dp * args.seq
    if dist.get_rank() == 0:
        print(f"GPT {model.cfg.parameters() / 1e6:.2f}M parameters, "
              f"{layout._layout.describe()}, ZeRO {args.zero}, sp={args.sp}, "
              f"compile={args.compile}; {tokens_per_step} tokens per step", flush=True)
    history = []  # per step: wall s, modelled us, compute us, bubble us, loss
    if args.trace_out:
        fabric.start_trace()
    for step, (x, y) in enumerate(loader):
        dist.barrier()
        clock0, start = fabric.clock()["compute_us"], time.perf_counter()
        fabric.mark("step_begin")
        loss, compute_us, bubble_us, norm = train_step(args, model, parts, params, engine,
                                                       opt, x, y)
        fabric.mark("step_end")
        *figures, rss = report_step(args, layout, step, loss, start, clock0, compute_us,
                                    bubble_us, norm, tokens_per_step)
        history.append(tuple(figures))
    if args.trace_out:
        fabric.save_trace(args.trace_out)
    memory = gather_memory(layout)
    if args.metrics_out:
        write_metrics(args, layout, history, tokens_per_step, rss,
                      max(row[5] for row in memory))
    if dist.get_rank() == 0:
        print_memory(memory)
    dist.barrier()
    return 0


def gather_memory(layout):
    """Every rank's (rank, tp, pp, dp, max RSS MiB, model-state peak MiB), on
    every rank (one collective)."""
    mine = (dist.get_rank(), layout.tp_rank, layout.pp_rank, layout.dp_rank,
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            parallel.model_state_memory()["peak"] / 2**20)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def print_memory(everyone):
    print("memory per rank (model state: ZeRO's sharded parameters, gradients and optimizer "
          "state; 0 without --zero):", flush=True)
    print(" rank  tp  pp  dp  max RSS MiB  model-state peak MiB", flush=True)
    for rank, tp, pp, dp, rss, state in everyone:
        print(f"{rank:5d} {tp:3d} {pp:3d} {dp:3d} {rss:12.0f} {state:21.3f}", flush=True)


def write_metrics(args, layout, history, tokens_per_step, rss, model_state_mib):
    """The figures `neuronrun matrix` collects, from rank 0 (steps after the
    first; the slowest rank's times and the largest model state)."""
    groups = [None, parallel.get_tensor_parallel_group(), parallel.get_data_parallel_group(),
              parallel.get_pipeline_parallel_group()]
    volume = collective_bytes(groups, len(history))
    # Compile time (IR to executable; the slowest rank's): cold, where the
    # graphs were compiled, and warm, loading them from the disk cache.
    compile_ms = None
    if args.compile:
        warm = torchneuron.compiler.measure_warm_compile()
        times = torchneuron.compiler.compile_times()
        compile_ms = torch.tensor([times["cold_s"] * 1e3, -1.0 if warm is None else warm * 1e3,
                                   times["graphs"]], dtype=torch.float64)
        dist.all_reduce(compile_ms, op=dist.ReduceOp.MAX)
    if dist.get_rank() != 0:
        return
    warm = history[1:] or history
    modelled = median([h[1] for h in warm])
    compute = median([h[2] for h in warm])
    bubble = median([h[3] for h in warm])
    figures = {
        "world": layout.world_size, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp,
        "steps": len(history), "loss": history[-1][4], "tokens_per_step": tokens_per_step,
        "first_step_ms": history[0][0] * 1e3, "wall_step_ms": median([h[0] for h in warm]) * 1e3,
        "modelled_step_us": modelled, "compute_us": compute, "bubble_us": bubble,
        "exposed_comm_us": max(0.0, modelled - compute - bubble),
        "wall_tokens_per_s": tokens_per_step / median([h[0] for h in warm]),
        "modelled_tokens_per_s": tokens_per_step / modelled * 1e6,
        "modelled_tokens_per_s_per_device": tokens_per_step / modelled * 1e6 / layout.world_size,
        "max_rss_mib": rss, "model_state_mib": model_state_mib,
    }
    if compile_ms is not None and compile_ms[2].item() > 0:  # some graph compiled
        figures["compiled_graphs"] = int(compile_ms[2].item())
        figures["cold_compile_ms"] = compile_ms[0].item()
        if compile_ms[1].item() >= 0:
            figures["warm_compile_ms"] = compile_ms[1].item()
    run_figures.write(args.metrics_out, figures, volume)


if __name__ == "__main__":
    sys.exit(main())
