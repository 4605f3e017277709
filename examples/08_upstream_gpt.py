"""Example 08: a GPT trained with PyTorch's own parallel APIs on "neuron":
FSDP2 x tensor parallel x pipeline parallel over a 3-D DeviceMesh.

    neuronrun -n 8 examples/08_upstream_gpt.py --pp 2 --tp 2           # dp = 8 / 4 = 2
    neuronrun -n 16 examples/08_upstream_gpt.py --pp 2 --tp 2 --sp     # + sequence parallel
    neuronrun -n 4 examples/08_upstream_gpt.py                         # FSDP2 only
    neuronrun -n 16 examples/08_upstream_gpt.py --pp 2 --tp 2 --compile  # blocks compiled
    torchrun --nproc-per-node 4 examples/08_upstream_gpt.py --tp 2     # torchrun works too

The training is PyTorch's own; torchneuron provides the model
(torchneuron.models.plain_gpt: plain torch.nn layers) and the figures
(torchneuron.fabric's clocks, the compiler's metrics, the matrix's
RunFigures): the device and the
backend come from torch.accelerator, the mesh from init_device_mesh
("pp", "dp", "tp"), tensor parallelism from parallelize_module
(Colwise/Rowwise, SequenceParallel with --sp), sharding from FSDP2's
fully_shard over "dp", the pipeline from torch.distributed.pipelining
(PipelineStage and ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B
over "pp"), --zero 2 keeps FSDP2's gathered parameters until backward,
--metrics-out and --trace-out write the figures and the operation trace
`neuronrun matrix` collects (its cells' `script`), --compile compiles each
transformer block with
torch.compile(backend="neuron") (after tensor parallelism, before FSDP2, as
torchtitan does), and --checkpoint DIR saves the model and optimizer with
DCP.

The data is synthetic: uniform random tokens, or with --data counting
sequences that count up by one from random starts, which the model learns:
the loss falls within a few steps (`make demo` runs that). Rank 0 prints per step the loss, the wall time and
tokens/s on this machine, and the modelled Trainium2 step (the slowest
rank's simulated clock: the device model for every operation, the fabric
model for every collective) with its tokens/s per device; at the end, the
loss's first and last values and whether it fell, and the peak device
memory of every rank.
"""
import argparse
import resource
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

import torchneuron  # registers the "neuron" device and backend
from torchneuron import fabric, run_figures
from torchneuron.run_figures import collective_bytes, median
from torchneuron.models.plain_gpt import (GPT, PlainGPTConfig, apply_fully_shard,
                                          apply_tensor_parallel, loss_fn, pipeline_stage)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved": ScheduleInterleaved1F1B}


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=1, help="tensor parallel")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--sp", action="store_true", help="sequence parallel (with --tp > 1)")
    p.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="sequences per data-parallel rank")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data", default="random", choices=["counting", "random"],
                   help="synthetic tokens: uniform random tokens, or sequences counting up "
                        "from random starts (a task the model learns: the loss falls)")
    p.add_argument("--compile", action="store_true",
                   help='torch.compile(backend="neuron") each transformer block')
    p.add_argument("--zero", type=int, default=3, choices=[2, 3],
                   help="FSDP2's sharding: 3 reshards parameters after forward, 2 keeps "
                        "them until backward (reshard_after_forward=False)")
    p.add_argument("--checkpoint", help="save the model and optimizer here with DCP at the end")
    p.add_argument("--metrics-out", help="write the run's figures to this file (a RunFigures "
                   "text proto, for `neuronrun matrix`)")
    p.add_argument("--trace-out", help="record the operation trace into this directory "
                   "(replayed by `neuronrun replay` and the matrix's modelled cells)")
    return p.parse_args()


def check_layout(args, world):
    """Refuses a layout the model cannot take, naming the option."""
    if world % (args.pp * args.tp):
        raise SystemExit(f"world size {world} is not divisible by pp x tp = {args.pp * args.tp}")
    if args.sp and args.tp == 1:
        raise SystemExit("--sp splits the sequence over tensor parallelism: it needs --tp > 1")
    if args.heads % args.tp:
        raise SystemExit(f"--heads {args.heads} does not split over --tp {args.tp}")


def build_stages(args, cfg, mesh, device):
    """This rank's stages (rank, rank + pp, ... with the interleaved
    schedule), tensor parallel and fully sharded, and the pipeline schedule
    over them (None without --pp)."""
    pp_rank = mesh["pp"].get_local_rank()
    virtual = 2 if args.schedule == "interleaved" and args.pp > 1 else 1
    n_stages = args.pp * virtual
    modules, stages = [], []
    for s in range(pp_rank, n_stages, args.pp):
        torch.manual_seed(0)  # every rank builds the same full model, then keeps its part
        m = pipeline_stage(GPT(cfg), n_stages, s).to(device)
        if args.tp > 1:
            apply_tensor_parallel(m, mesh["tp"], args.sp)
        if args.compile:
            for layer in m.layers.values():
                layer.compile(backend="neuron")
        apply_fully_shard(m, mesh["dp"], reshard_after_forward=args.zero == 3)
        modules.append(m)
        if args.pp > 1:
            stages.append(PipelineStage(m, s, n_stages, device, group=mesh["pp"].get_group()))
    schedule = None
    if args.pp > 1:
        schedule = SCHEDULES[args.schedule](stages if virtual > 1 else stages[0],
                                            n_microbatches=args.microbatches, loss_fn=loss_fn)
    return modules, schedule


def train_step(modules, schedule, opt, x, y, pp_rank, last_stage):
    """One step's forward, backward and optimizer; the batch's loss on the
    last stage (zero elsewhere)."""
    opt.zero_grad()
    if schedule is None:
        loss = loss_fn(modules[0](x), y)
        loss.backward()
    else:
        losses = []
        if pp_rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        loss = torch.stack(losses).mean() if last_stage else torch.zeros((), device=x.device)
    opt.step()
    return loss


def device_compute_us(device):
    """The device model's compute on this rank so far: its eager operations
    and every run of its compiled graphs (0 off the "neuron" device)."""
    if device.type != "neuron":
        return 0.0
    graphs = sum(e["modelled_us"] * e.get("runs", 0) for e in torchneuron.compiler.metrics()
                 if "modelled_us" in e)
    return fabric.eager_totals()["modelled_us"] + graphs


def report_step(args, step, loss, times, dp, last_stage, tokens_per_step):
    """The batch's loss (the last stage's, averaged over data parallel) and
    the slowest rank's (wall s, modelled us, compute us); rank 0 prints them.
    Returns (wall, modelled, compute, loss), the same on every rank."""
    world = dist.get_world_size()
    figures = torch.tensor([loss.item() / dp if last_stage else 0.0, *times],
                           dtype=torch.float64)
    summed = figures[:1].clone()
    dist.all_reduce(summed)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    wall, modelled, compute = figures[1:].tolist()
    mean_loss = summed.item() / args.tp  # each tensor-parallel rank holds the loss
    if dist.get_rank() == 0:
        line = (f"step {step}: loss {mean_loss:.4f}, wall {wall * 1e3:.1f} ms "
                f"({tokens_per_step / wall:.0f} tokens/s)")
        if modelled > 0:
            line += (f", modelled Trainium2 step {modelled:.1f} us "
                     f"({tokens_per_step / (modelled * 1e-6) / world:.0f} tokens/s/device)")
        print(line, flush=True)
    return wall, modelled, compute, mean_loss


def model_state_mib(modules, opt):
    """This rank's share of the model state: its shards of the parameters,
    their gradients and the optimizer state."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t
    tensors = [p for m in modules for p in m.parameters()]
    tensors += [p.grad for p in tensors if p.grad is not None]
    tensors += [v for state in opt.state.values() for v in state.values()
                if isinstance(v, torch.Tensor)]
    return sum(local(t).numel() * t.element_size() for t in tensors) / 2**20


# The memory phases of a run on "neuron" (torch.neuron.memory_phase_peaks):
# building and sharding the model, the first step (compiles, makes the
# optimizer state), the steps after.
PHASES = ("load", "warmup", "step")


def set_memory_phase(device, phase):
    """Makes `phase` the device's memory phase (None: none); off "neuron", nothing."""
    if device.type == "neuron":
        torch.neuron.set_memory_phase(phase)


def write_metrics(args, mesh, modules, opt, history, tokens_per_step, device):
    """The figures `neuronrun matrix` collects (a RunFigures text proto,
    launcher/proto/neuron/launcher/matrix_result.proto), from rank 0: medians
    over the steps after the first, the slowest rank's times, the largest
    rank's memory (by phase on "neuron")."""
    volume = collective_bytes([mesh[name].get_group() for name in mesh.mesh_dim_names],
                              len(history))
    mine = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            model_state_mib(modules, opt), 0.0, -1.0, 0.0]
    if args.compile:  # IR to executable: cold (compiled here) and warm (from the disk cache)
        warm = torchneuron.compiler.measure_warm_compile()
        times = torchneuron.compiler.compile_times()
        mine[2:] = [times["cold_s"] * 1e3, -1.0 if warm is None else warm * 1e3, times["graphs"]]
    peaks = torch.neuron.memory_phase_peaks() if device.type == "neuron" else {}
    mine += [peaks.get(p, {}).get("allocated_bytes", 0) / 2**20 for p in PHASES]
    largest = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    if dist.get_rank() != 0:
        return
    warm = history[1:] or history
    wall, modelled, compute = (median([h[k] for h in warm]) for k in range(3))
    world = dist.get_world_size()
    figures = {
        "world": world, "tp": args.tp, "pp": args.pp, "dp": world // (args.tp * args.pp),
        "steps": len(history), "loss": history[-1][3], "tokens_per_step": tokens_per_step,
        "first_step_ms": history[0][0] * 1e3, "wall_step_ms": wall * 1e3,
        "wall_tokens_per_s": tokens_per_step / wall,
        "max_rss_mib": largest[0].item(), "model_state_mib": largest[1].item(),
    }
    if modelled > 0:
        figures.update({
            "modelled_step_us": modelled, "compute_us": compute,
            "exposed_comm_us": max(0.0, modelled - compute),
            "modelled_tokens_per_s": tokens_per_step / modelled * 1e6,
            "modelled_tokens_per_s_per_device": tokens_per_step / modelled * 1e6 / world})
    if largest[4].item() > 0:  # some graph compiled
        figures["compiled_graphs"] = int(largest[4].item())
        figures["cold_compile_ms"] = largest[2].item()
        if largest[3].item() >= 0:
            figures["warm_compile_ms"] = largest[3].item()
    by_phase = {p: largest[5 + i].item() for i, p in enumerate(PHASES) if p in peaks}
    run_figures.write(args.metrics_out, figures, volume, by_phase)


def report_memory(device):
    """Every rank's peak device memory, printed by rank 0."""
    peak = torch.tensor([torch.neuron.max_memory_allocated() / 2**20
                         if device.type == "neuron" else 0.0], dtype=torch.float64)
    every = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
    dist.all_gather(every, peak)
    if dist.get_rank() == 0:
        print("peak device memory per rank (MiB): " +
              " ".join(f"{t.item():.2f}" for t in every), flush=True)


def report_compiled():
    """What torch.compile made of this rank's blocks (rank 0 prints it): the
    graphs the device runs, their modelled time per run, and what ran
    between them (collectives; CPU fallbacks, if any)."""
    entries = torchneuron.compiler.metrics()
    graphs = [e for e in entries if "modelled_us" in e]
    between, on_cpu = {}, {}
    for e in entries:
        for table, into in ((e.get("collectives", {}), between), (e["fallback_ops"], on_cpu)):
            for op, n in table.items():
                into[op] = into.get(op, 0) + n
    if dist.get_rank() == 0:
        print(f"compiled: {len(graphs)} device graphs on rank 0 "
              f"({sum(e['modelled_us'] for e in graphs):.1f} us modelled for one run of each); "
              f"between them: {between or 'nothing'}; on the CPU: {on_cpu or 'nothing'}",
              flush=True)


def synthetic_tokens(args, dp):
    """Next-token data, [steps, dp, batch, seq + 1]: each data-parallel rank
    takes its share of each step's batch. "random": uniform tokens, nothing
    to learn; "counting": every sequence counts up by one (modulo the
    vocabulary) from a random start, a task the model learns within a few
    steps, so the loss visibly falls."""
    g = torch.Generator().manual_seed(1)
    shape = (args.steps, dp, args.batch)
    if args.data == "random":
        return torch.randint(0, args.vocab, (*shape, args.seq + 1), generator=g)
    start = torch.randint(0, args.vocab, (*shape, 1), generator=g)
    return (start + torch.arange(args.seq + 1)) % args.vocab


def main():
    args = parse()
    accelerator = torch.accelerator.current_accelerator()
    device = torch.device(accelerator.type, torch.accelerator.current_device_index())
    dist.init_process_group(backend=dist.get_default_backend_for_device(accelerator))
    world = dist.get_world_size()
    check_layout(args, world)
    dp = world // (args.pp * args.tp)
    mesh = init_device_mesh(device.type, (args.pp, dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    cfg = PlainGPTConfig(vocab=args.vocab, seq=args.seq, dim=args.dim, heads=args.heads,
                         layers=args.layers)
    set_memory_phase(device, "load")
    modules, schedule = build_stages(args, cfg, mesh, device)
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=args.lr)

    tokens = synthetic_tokens(args, dp)
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    last_stage = pp_rank == args.pp - 1
    if dist.get_rank() == 0:
        print(f"upstream GPT: {world} ranks = pp {args.pp} x dp {dp} x tp {args.tp}"
              f"{' (sequence parallel)' if args.sp else ''} on {device.type}, backend "
              f"{dist.get_backend()}, schedule {args.schedule if args.pp > 1 else '-'}", flush=True)
    tokens_per_step = dp * args.batch * args.seq
    history = []  # per step: wall s, modelled us, compute us, loss (the slowest rank's)
    if args.trace_out:
        fabric.start_trace()
    for step in range(args.steps):
        set_memory_phase(device, "warmup" if step == 0 else "step")
        x = tokens[step, dp_rank, :, :-1].to(device)
        y = tokens[step, dp_rank, :, 1:].to(device)
        clock0 = fabric.clock()["compute_us"] if device.type == "neuron" else 0.0
        compute0 = device_compute_us(device)
        start = time.perf_counter()
        fabric.mark("step_begin")
        loss = train_step(modules, schedule, opt, x, y, pp_rank, last_stage)
        fabric.mark("step_end")
        wall = time.perf_counter() - start
        modelled = (fabric.clock()["compute_us"] - clock0) if device.type == "neuron" else 0.0
        times = (wall, modelled, device_compute_us(device) - compute0)
        history.append(report_step(args, step, loss, times, dp, last_stage, tokens_per_step))
    set_memory_phase(device, None)
    if dist.get_rank() == 0:
        first, last = history[0][3], history[-1][3]
        print(f"training: loss {first:.4f} -> {last:.4f} over {len(history)} steps "
              f"({'falls' if last < first else 'does not fall'})", flush=True)
    if args.trace_out:
        fabric.save_trace(args.trace_out, mesh)
    if args.metrics_out:
        write_metrics(args, mesh, modules, opt, history, tokens_per_step, device)

    if args.checkpoint:
        # This rank's stages (their parameter names keep the full model's
        # layer indices, so the ranks' keys do not collide).
        model_sd, optim_sd = get_state_dict(torch.nn.ModuleList(modules), opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=args.checkpoint)
        if dist.get_rank() == 0:
            print(f"saved a DCP checkpoint of the model and optimizer to {args.checkpoint}")
    if args.compile:
        report_compiled()
    report_memory(device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
