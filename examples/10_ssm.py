"""Example 10: a Mamba-style selective-scan language model trained on
"neuron", eager or compiled.

    .venv/bin/python examples/10_ssm.py                 # PYTHONPATH=build/python
    .venv/bin/python examples/10_ssm.py --compile       # torch.compile(backend="neuron")
    neuronrun -n 1 examples/10_ssm.py --compile         # neuronrun sets PYTHONPATH
    .venv/bin/python examples/10_ssm.py --device cpu    # the same on the CPU

The model is torchneuron.models.ssm: token embedding, --layers blocks of
input projection, causal depthwise convolution, input-dependent step
delta and matrices B and C, the selective scan (the cumsum of the
log-decays, exp, a causal weight per channel, a batched matmul), the gate
and the output projection; LM head and cross-entropy. With --compile the
whole model, loss included, is one forward and one backward graph on the
device (fullgraph=True: an op the device did not run would be an error).

The data counts up by one (modulo the vocabulary) from a random start per
sequence: learnt, the loss falls. Per step it prints the loss, the wall
time on this machine and, on "neuron", the modelled step on a Trainium2
NeuronCore (the compute clock: eager ops charged one by one, or the
compiled graphs' plans); at the end the median step after the first and
whether the loss fell.
"""
import argparse
import sys
import time

import torch

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


def counting_tokens(args):
    """[steps, batch, seq + 1]: each sequence counts up by one (modulo the
    vocabulary) from a random start."""
    g = torch.Generator().manual_seed(args.seed + 1)
    start = torch.randint(0, args.vocab, (args.steps, args.batch, 1), generator=g)
    return (start + torch.arange(args.seq + 1)) % args.vocab


def main():
    args = parse()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    cfg = SSMConfig(vocab=args.vocab, seq=args.seq, dim=args.dim, inner=args.inner,
                    state=args.state, layers=args.layers)
    model = SSMLM(cfg).to(device)
    step_fn = torch.compile(model, backend="neuron", fullgraph=True) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    tokens = counting_tokens(args)
    params = sum(p.numel() for p in model.parameters())
    print(f"selective-scan LM: {params / 1e3:.1f}K parameters, {args.layers} layers, "
          f"inner {args.inner}, state {args.state}, seq {args.seq}, batch {args.batch} "
          f"on {device.type}{', compiled' if args.compile else ', eager'}", flush=True)
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
        history.append((value, wall, modelled))
        if step % args.print_every == 0 or step == args.steps - 1:
            line = f"step {step:3d}  loss {value:.4f}  wall {wall * 1e3:.1f} ms"
            if on_neuron:
                line += f"  modelled Trainium2 step {modelled:.1f} us"
            print(line, flush=True)
    return summary(args, history, on_neuron)


def summary(args, history, on_neuron):
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
