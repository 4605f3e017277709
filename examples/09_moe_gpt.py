"""Example 09: a Mixtral-style Mixture-of-Experts GPT trained with expert
parallelism x data parallelism (x tensor parallelism) on "neuron".

    neuronrun -n 8 examples/09_moe_gpt.py                        # ep 4 x dp 2
    neuronrun -n 8 examples/09_moe_gpt.py --ep 2 --tp 2          # ep 2 x dp 2 x tp 2
    neuronrun -n 8 examples/09_moe_gpt.py --compile              # blocks compiled
    neuronrun -n 8 examples/09_moe_gpt.py --fsdp                 # FSDP2 over dp / dp x ep
    neuronrun -n 8 examples/09_moe_gpt.py --backend gloo         # the same on the CPU, Gloo

The model is torchneuron.models.moe_gpt (attention, then top-2 of 8
SwiGLU experts with capacity factor 1.25 in every block); the layout
torchneuron.parallel.moe's, on a ("dp", "ep", "tp") DeviceMesh: each ep
rank holds 8 / ep experts of every layer and exchanges tokens with the
other ep ranks through all_to_all_single with uneven splits; the batch is
split over dp x ep; attention (parallelize_module) and each expert's
hidden dimension are split over tp. Expert gradients are averaged over
their replicas ("dp") and the rest over dp x ep: by hand
(moe.reduce_gradients), or with --fsdp by FSDP2 as torchtitan shards them
(moe.apply_fully_shard). --compile compiles each block with
torch.compile(backend="neuron"): attention, the norms, the gate and the
experts become device graphs; the routing decisions (softmax, top-k,
capacity), the dispatch and the combine run eagerly between them (their
sizes are data), and the experts see one shape (rows padded to ep x
capacity).

Rank 0 prints per step the loss (cross-entropy plus 0.01 x the
load-balancing loss, averaged over the shards), the wall time, the
assignments dropped for capacity, and on "neuron" the modelled Trainium2
step (the slowest rank's simulated clock) and its all-to-all time (that
rank's all_to_all_single calls on the ep group, counts and tokens, forward
and backward, on the fabric model) with its share of the step; at the end
the median step after the first and whether the loss fell.

As a `neuronrun matrix` trainer (a matrix model with `experts`; docs/scaling.md):
--metrics-out writes the run's figures (a RunFigures text proto) and
--trace-out the operation trace; --zero 3 is --fsdp (0: gradients
all-reduced by hand), and --pp and --microbatches take only what a layout
without a pipeline has (pp 1).
"""
import argparse
import resource
import time

import torch
import torch.distributed as dist

import torchneuron  # registers the "neuron" device and backend
from torchneuron import fabric, run_figures
from torchneuron.models.moe_gpt import MoEGPT, MoEGPTConfig, apply_tensor_parallel, loss_fn
from torchneuron.parallel import moe
from torchneuron.run_figures import collective_bytes, device_compute_us, median, model_state_mib


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ep", type=int, default=4, help="expert parallel")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel (attention, experts)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 instead of all-reduced gradients")
    p.add_argument("--compile", action="store_true",
                   help='torch.compile(backend="neuron") each block')
    p.add_argument("--backend", default=None, choices=["neuron", "gloo"],
                   help="neuron (the accelerator, the default) or gloo (the CPU)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8, help="sequences per dp x ep shard")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128, help="each expert's hidden width")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="0: no dropping")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data", default="counting", choices=["counting", "random"],
                   help="sequences counting up from random starts (learnt: the loss "
                        "falls), or uniform random tokens")
    p.add_argument("--zero", type=int, default=0, choices=[0, 3],
                   help="0: gradients all-reduced by hand; 3: FSDP2 (as --fsdp)")
    p.add_argument("--pp", type=int, default=1, choices=[1], help="no pipeline: 1")
    p.add_argument("--microbatches", type=int, default=1,
                   help="pipeline microbatches: unused without a pipeline")
    p.add_argument("--metrics-out", help="write the run's figures to this file (a RunFigures "
                                         "text proto, for neuronrun matrix)")
    p.add_argument("--trace-out", help="record the operation trace into this directory "
                                       "(neuronrun replay, the matrix's modelled cells)")
    args = p.parse_args()
    args.fsdp = args.fsdp or args.zero == 3
    if args.trace_out and args.backend == "gloo":
        p.error("--trace-out records the neuron device's operations: not with --backend gloo")
    return args


def device_and_backend(args):
    if args.backend == "gloo":
        return torch.device("cpu"), "gloo"
    accelerator = torch.accelerator.current_accelerator()
    return (torch.device(accelerator.type, torch.accelerator.current_device_index()),
            dist.get_default_backend_for_device(accelerator))


def build(args, cfg, mesh, device):
    """The model, expert (and tensor) parallel, compiled, gradient-reduced
    by hand or by FSDP2."""
    torch.manual_seed(0)  # every rank builds the same full model, then keeps its part
    model = MoEGPT(cfg).to(device)
    if args.tp > 1:
        apply_tensor_parallel(model, mesh["tp"])
    moe.apply_expert_parallel(model, mesh)
    if args.compile:
        for layer in model.layers.values():
            layer.compile(backend="neuron")
    if args.fsdp:
        moe.apply_fully_shard(model, mesh, modules=list(model.layers.values()))
    return model


def synthetic_tokens(args, shards):
    """[steps, shards, batch, seq + 1]: "counting" sequences count up by one
    (modulo the vocabulary) from random starts; "random" are uniform."""
    g = torch.Generator().manual_seed(1)
    shape = (args.steps, shards, args.batch)
    if args.data == "random":
        return torch.randint(0, args.vocab, (*shape, args.seq + 1), generator=g)
    start = torch.randint(0, args.vocab, (*shape, 1), generator=g)
    return (start + torch.arange(args.seq + 1)) % args.vocab


def alltoall_since(group, sequence, device):
    """(modelled us of the group's all-to-alls after `sequence`, the last
    sequence number); zeros off the neuron backend."""
    if device.type != "neuron":
        return 0.0, sequence
    records = [r for r in fabric.records(group) if r["sequence"] > sequence]
    a2a = sum(r["modelled_us"] for r in records if r["op"] == "alltoall")
    return a2a, max([sequence] + [r["sequence"] for r in records])


def train_step(args, model, opt, mesh, x, y, cfg):
    opt.zero_grad()
    loss = loss_fn(model(x), y) + cfg.aux_coefficient * moe.load_balancing_losses(model)
    loss.backward()
    if not args.fsdp:
        moe.reduce_gradients(model, mesh)
    opt.step()
    return loss


def report(step, loss, times, model, args):
    """Every rank's figures to all; rank 0 prints the step. `times`: this
    rank's (wall s, modelled us, all-to-all us, device compute us). Returns
    (loss, wall, modelled, all-to-all, compute): the mean loss over the
    shards, the slowest rank's wall and modelled step, and that rank's
    all-to-all and compute."""
    dropped = sum(m.stats.dropped for m in moe.moe_layers(model))
    mine = torch.tensor([loss.item(), *times, dropped], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    every = torch.stack(every)
    slowest = int(every[:, 2].argmax())
    mean_loss = every[:, 0].mean().item()  # tp ranks hold the same shard: equal weights
    wall, (modelled, a2a, compute) = every[:, 1].max().item(), every[slowest, 2:5].tolist()
    assignments = dist.get_world_size() // args.tp * args.batch * args.seq * args.top_k
    if dist.get_rank() == 0:
        line = (f"step {step}: loss {mean_loss:.4f}, wall {wall * 1e3:.1f} ms, dropped "
                f"{int(every[:, 5].sum().item()) // args.tp} of {assignments * args.layers} "
                f"assignments")
        if modelled > 0:
            line += (f", modelled Trainium2 step {modelled:.1f} us, all-to-all {a2a:.1f} us "
                     f"({100 * a2a / modelled:.1f}%)")
        print(line, flush=True)
    return mean_loss, wall, modelled, a2a, compute


def write_metrics(args, mesh, model, opt, history):
    """The figures `neuronrun matrix` collects (a RunFigures text proto,
    launcher/proto/neuron/launcher/matrix_result.proto), from rank 0:
    medians over the steps after the first, the slowest rank's times, the
    largest rank's memory."""
    volume = collective_bytes([mesh[name].get_group() for name in mesh.mesh_dim_names] +
                              [moe.replica_mesh(mesh).get_group()], len(history))
    largest = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                            model_state_mib(model.parameters(), opt)], dtype=torch.float64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    if dist.get_rank() != 0:
        return
    world = dist.get_world_size()
    tokens_per_step = world // args.tp * args.batch * args.seq
    warm = history[1:] or history
    wall, modelled, compute = (median([h[k] for h in warm]) for k in (1, 2, 4))
    figures = {
        "world": world, "tp": args.tp, "pp": 1, "dp": world // args.tp, "steps": len(history),
        "loss": history[-1][0], "tokens_per_step": tokens_per_step,
        "first_step_ms": history[0][1] * 1e3, "wall_step_ms": wall * 1e3,
        "wall_tokens_per_s": tokens_per_step / wall, "max_rss_mib": largest[0].item(),
        "model_state_mib": largest[1].item()}
    if modelled > 0:
        figures.update({
            "modelled_step_us": modelled, "compute_us": compute,
            "exposed_comm_us": max(0.0, modelled - compute),
            "modelled_tokens_per_s": tokens_per_step / modelled * 1e6,
            "modelled_tokens_per_s_per_device": tokens_per_step / modelled * 1e6 / world})
    run_figures.write(args.metrics_out, figures, volume)


def train(args, model, opt, mesh, cfg, device, tokens, shard):
    """The steps (each between the trace's step marks); returns report()'s
    figures per step."""
    neuron = device.type == "neuron"
    ep_group, sequence, history = mesh["ep"].get_group(), 0, []
    _, sequence = alltoall_since(ep_group, sequence, device)
    if args.trace_out and neuron:
        fabric.start_trace()
    for step in range(args.steps):
        x = tokens[step, shard, :, :-1].to(device)
        y = tokens[step, shard, :, 1:].to(device)
        clock0 = fabric.clock()["compute_us"] if neuron else 0.0
        compute0 = device_compute_us(device)
        start = time.perf_counter()
        fabric.mark("step_begin")
        loss = train_step(args, model, opt, mesh, x, y, cfg)
        fabric.mark("step_end")
        wall = time.perf_counter() - start
        modelled = fabric.clock()["compute_us"] - clock0 if neuron else 0.0
        a2a, sequence = alltoall_since(ep_group, sequence, device)
        times = (wall, modelled, a2a, device_compute_us(device) - compute0)
        history.append(report(step, loss, times, model, args))
    return history


def report_compiled():
    """What torch.compile made of the blocks on rank 0: device graphs, what
    ran between them, CPU fallbacks inside them."""
    entries = torchneuron.compiler.metrics()
    graphs = [e for e in entries if "modelled_us" in e]
    on_cpu = {}
    for e in entries:
        for op, n in e["fallback_ops"].items():
            on_cpu[op] = on_cpu.get(op, 0) + n
    if dist.get_rank() == 0:
        print(f"compiled: {len(graphs)} device graphs on rank 0; CPU fallbacks inside them: "
              f"{on_cpu or 'none'}; eager between them: routing decisions, dispatch, combine",
              flush=True)


def summary(history, device):
    if dist.get_rank() != 0:
        return
    first, last = history[0][0], history[-1][0]
    warm = history[1:] or history
    wall = median([h[1] for h in warm]) * 1e3
    line = f"median step after the first: wall {wall:.1f} ms"
    if device.type == "neuron":
        modelled, a2a = median([h[2] for h in warm]), median([h[3] for h in warm])
        line += f", modelled {modelled:.1f} us, all-to-all {a2a:.1f} us"
    print(line, flush=True)
    print(f"training: loss {first:.4f} -> {last:.4f} over {len(history)} steps "
          f"({'falls' if last < first else 'does not fall'})", flush=True)


def main():
    args = parse()
    torch.set_num_threads(1)
    device, backend = device_and_backend(args)
    dist.init_process_group(backend=backend)
    world = dist.get_world_size()
    if args.heads % args.tp:
        raise SystemExit(f"--heads {args.heads} does not split over --tp {args.tp}")
    try:
        mesh = moe.expert_parallel_mesh(device.type, ep=args.ep, tp=args.tp)
        cfg = MoEGPTConfig(vocab=args.vocab, seq=args.seq, dim=args.dim, heads=args.heads,
                           layers=args.layers, num_experts=args.experts, top_k=args.top_k,
                           hidden=args.hidden, capacity_factor=args.capacity_factor or None,
                           static_rows=args.compile and args.capacity_factor > 0)
        model = build(args, cfg, mesh, device)
    except ValueError as e:
        raise SystemExit(str(e))
    # Tensor parallelism without FSDP2 mixes DTensor (attention) and plain
    # (expert) parameters, which torch's multi-tensor AdamW refuses.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            foreach=False if args.tp > 1 and not args.fsdp else None)
    dp = mesh["dp"].size()
    shard = mesh["dp"].get_local_rank() * args.ep + mesh["ep"].get_local_rank()
    tokens = synthetic_tokens(args, dp * args.ep)
    if dist.get_rank() == 0:
        total, active = model.parameter_counts()
        print(f"MoE GPT: {total / 1e6:.2f}M parameters ({active / 1e6:.2f}M active per token), "
              f"{args.layers} layers of top-{args.top_k} of {args.experts} experts, capacity "
              f"factor {args.capacity_factor or 'none'}; {world} ranks = dp {dp} x ep {args.ep}"
              f" x tp {args.tp} on {device.type}, backend {backend}"
              f"{', FSDP2' if args.fsdp else ''}{', compiled' if args.compile else ''}",
              flush=True)
    history = train(args, model, opt, mesh, cfg, device, tokens, shard)
    summary(history, device)
    if args.trace_out:
        fabric.save_trace(args.trace_out, mesh)
    if args.metrics_out:
        write_metrics(args, mesh, model, opt, history)
    if args.compile:
        report_compiled()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
