"""Example 10: a Mamba-style selective-scan language model trained on
"neuron", eager or compiled.

    .venv/bin/python examples/10_ssm.py                 # PYTHONPATH=build/python
    .venv/bin/python examples/10_ssm.py --compile       # torch.compile(backend="neuron")
    neuronrun -n 1 examples/10_ssm.py --compile         # neuronrun sets PYTHONPATH
    neuronrun -n 2 examples/10_ssm.py --compile         # data parallel (DDP), 2 ranks
    .venv/bin/python examples/10_ssm.py --device cpu    # the same on the CPU

The model is torchneuron.models.ssm: token embedding, --layers blocks of
input projection, causal depthwise convolution, input-dependent step
delta and matrices B and C, the selective scan (the cumsum of the
log-decays, exp, a causal weight per channel, a batched matmul), the gate
and the output projection; LM head and cross-entropy. With --compile the
whole model, loss included, is one forward and one backward graph on the
device (fullgraph=True: an op the device did not run would be an error).

With more than one rank (WORLD_SIZE > 1, as neuronrun and torchrun set
it) the model is wrapped in torch's DistributedDataParallel over the
"neuron" process group ("gloo" with --device cpu) around the model
(compiled in place with --compile); each rank trains on its own --batch
sequences.

The data counts up by one (modulo the vocabulary) from a random start per
sequence: learnt, the loss falls. Per step rank 0 prints the loss (the
mean over the ranks), the wall time on this machine and, on "neuron", the
modelled step on a Trainium2 NeuronCore (the compute clock: eager ops
charged one by one, or the compiled graphs' plans, and with DDP the waits
for the gradients' all-reduce; the slowest rank's); at the end the median
step after the first and whether the loss fell.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torchneuron  # registers the "neuron" device and the compile backend
from torchneuron import fabric
from torchneuron.models.ssm import SSMLM, SSMConfig
from torchneuron.run_figures import median


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true",
                   help='torch.compile(backend="neuron", fullgraph=True) the model and loss')
    p.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--inner", type=int, default=64, help="scanned channels")
    p.add_argument("--state", type=int, default=8, help="the size of B and C")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=5)
    return p.parse_args()


def counting_tokens(args, rank):
    """[steps, batch, seq + 1] of this rank: each sequence counts up by one
    (modulo the vocabulary) from a random start."""
    g = torch.Generator().manual_seed(args.seed + 1 + 1000 * rank)
    start = torch.randint(0, args.vocab, (args.steps, args.batch, 1), generator=g)
    return (start + torch.arange(args.seq + 1)) % args.vocab


def join_ranks(args):
    """(rank, ranks): with WORLD_SIZE > 1 this rank joins the process group
    ("neuron" on the device, "gloo" on the CPU); one process otherwise."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    dist.init_process_group("neuron" if args.device == "neuron" else "gloo")
    return dist.get_rank(), dist.get_world_size()


def build(args, ranks):
    """(model, what runs the step, optimizer): with --compile the model is
    compiled in place (fullgraph: its forward and backward each one graph),
    then with more than one rank wrapped in DDP, whose hooks all-reduce the
    gradients the backward graph produces."""
    torch.manual_seed(args.seed)  # the same start on every rank
    cfg = SSMConfig(vocab=args.vocab, seq=args.seq, dim=args.dim, inner=args.inner,
                    state=args.state, layers=args.layers)
    model = SSMLM(cfg).to(args.device)
    if args.compile:
        model.compile(backend="neuron", fullgraph=True)
    step_fn = DDP(model) if ranks > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    return model, step_fn, opt


def mean_and_slowest(loss, modelled, ranks):
    """The loss averaged over the ranks and the slowest rank's modelled
    step (one all-reduce each; the values themselves with one rank)."""
    if ranks == 1:
        return loss, modelled
    figures = torch.tensor([loss / ranks, modelled], dtype=torch.float64)
    dist.all_reduce(figures[:1])
    dist.all_reduce(figures[1:], op=dist.ReduceOp.MAX)
    return figures[0].item(), figures[1].item()


def main():
    args = parse()
    rank, ranks = join_ranks(args)
    device = torch.device(args.device)
    model, step_fn, opt = build(args, ranks)
    tokens = counting_tokens(args, rank)
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"selective-scan LM: {params / 1e3:.1f}K parameters, {args.layers} layers, "
              f"inner {args.inner}, state {args.state}, seq {args.seq}, batch {args.batch} "
              f"x {ranks} rank(s) on {device.type}"
              f"{', compiled' if args.compile else ', eager'}", flush=True)
    on_neuron = device.type == "neuron"
    history = []
    for step in range(args.steps):
        x, y = tokens[step, :, :-1].to(device), tokens[step, :, 1:].to(device)
        clock0 = fabric.clock()["compute_us"] if on_neuron else 0.0
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_fn(x, y)
        loss.backward()
        opt.step()
        value = loss.item()
        wall = time.perf_counter() - start
        modelled = fabric.clock()["compute_us"] - clock0 if on_neuron else 0.0
        value, modelled = mean_and_slowest(value, modelled, ranks)
        history.append((value, wall, modelled))
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            line = f"step {step:3d}  loss {value:.4f}  wall {wall * 1e3:.1f} ms"
            if on_neuron:
                line += f"  modelled Trainium2 step {modelled:.1f} us"
            print(line, flush=True)
    code = summary(args, history, on_neuron) if rank == 0 else 0
    if ranks > 1:
        dist.destroy_process_group()
    return code


def summary(args, history, on_neuron):
    """Rank 0's closing lines; 0 when the loss fell, 1 otherwise."""
    warm = history[1:] or history
    line = f"median step after the first: wall {median([h[1] for h in warm]) * 1e3:.1f} ms"
    if on_neuron:
        line += f", modelled {median([h[2] for h in warm]):.1f} us"
    print(line, flush=True)
    if args.compile:
        rows = torchneuron.compiler.metrics()
        graphs = [r for r in rows if "modelled_us" in r]
        on_cpu = {op: n for r in rows for op, n in r["fallback_ops"].items()}
        print(f"compiled: {len(graphs)} device graphs (forward and backward: "
              f"{sum(r['modelled_us'] for r in graphs):.1f} us of the step; the rest is the "
              f"optimizer and the inputs' copies, eager), CPU fallbacks: {on_cpu or 'none'}",
              flush=True)
    first, last = history[0][0], history[-1][0]
    falls = last < first
    print(f"training: loss {first:.4f} -> {last:.4f} over {len(history)} steps "
          f"({'falls' if falls else 'does not fall'})", flush=True)
    return 0 if falls else 1


if __name__ == "__main__":
    sys.exit(main())
