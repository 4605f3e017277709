#!/usr/bin/env python3
"""The selective scan kernel (torchneuron.nki.selective_scan) against the
same scan (torchneuron.models.ssm.selective_scan, the closed form the model
runs) as eager operations on "neuron" and as a compiled graph: each one's
modelled time on the simulated NeuronCore (the device model; the machine's
wall time does not enter), per shape.

    .venv/bin/python benchmarks/nki_scan.py [--build build]
                                            [--shapes 1x64x128x16,1x512x128x16]
                                            [--dtype float32] [--backward]

Shapes are batch x T x inner x state. Columns (with --backward, forward
and backward, a gradient of ones): kernel (the kernels' operator,
torchneuron.nki.selective_scan_op.selective_scan, which charges the clock
selective_scan's list schedule and with --backward
selective_scan_backward's), eager (the model's scan as eager ops on
"neuron"), compiled (torch.compile(backend="neuron") of it), each the
second call's charge to the compute clock (with --backward it includes the
eager operations around the kernels or graphs: the seed gradient and the
gradients' accumulation into the inputs); graph_us the compiled graphs'
own modelled time from torchneuron.compiler.metrics(), nan when a graph
ran on the CPU; cpu_segments counts the compiler's warnings of parts it
ran on the CPU, priced as fallbacks; and compiled / kernel.
docs/performance.md records a run.
"""
import argparse
import os
import sys
import warnings


def charged(fn):
    from torchneuron import fabric
    before = fabric.clock()["charged_us"]
    fn()
    return fabric.clock()["charged_us"] - before


def step(fn, args, backward):
    """fn(*args), and its backward (a fixed dy) when `backward`."""
    def run():
        out = fn(*args)
        if backward:
            out.backward(out.new_ones(out.shape))
    return run


def inputs(shape, dtype, backward):
    """x, delta, A, B, C on "neuron" as the model makes them (delta a
    sigmoid, A = exp(A_log) in [1, 4])."""
    import torch
    batch, seq, inner, state = shape
    torch.manual_seed(0)
    x = torch.randn(batch, seq, inner)
    delta = torch.sigmoid(torch.randn(batch, seq, inner))
    A = torch.exp(torch.linspace(0.0, 1.4, inner))
    B, C = torch.randn(batch, seq, state), torch.randn(batch, seq, state)
    return [v.to(dtype).to("neuron").requires_grad_(backward) for v in (x, delta, A, B, C)]


def measure(shape, dtype, backward):
    import torch
    import torchneuron
    from torchneuron.models.ssm import selective_scan as model_scan
    from torchneuron.nki.selective_scan_op import selective_scan
    args = inputs(shape, dtype, backward)
    mask = torch.ones(shape[1], shape[1], dtype=torch.bool).triu(1).to("neuron")
    step(selective_scan, args, backward)()
    rows = {"kernel": charged(step(selective_scan, args, backward))}
    step(model_scan, args + [mask], backward)()
    rows["eager"] = charged(step(model_scan, args + [mask], backward))
    compiled = torch.compile(model_scan, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(compiled, args + [mask], backward)()  # compiles
    rows["compiled"] = charged(step(compiled, args + [mask], backward))
    graphs = [r for r in torchneuron.compiler.metrics()
              if r["name"].startswith("selective_scan")][-(1 + backward):]
    rows["graph_us"] = sum(r.get("modelled_us", float("nan")) for r in graphs)
    rows["cpu_segments"] = sum("on the CPU" in str(w.message) for w in caught)
    torch._dynamo.reset()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--shapes", default="1x64x128x16,1x64x256x16,1x128x64x16,1x512x128x16")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backward", action="store_true", help="forward and backward")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    dtype = getattr(torch, args.dtype)
    print(f"selective scan, shape (batch x T x inner x state), {args.dtype}, "
          f"backward={args.backward}: modelled us")
    print(f"{'shape':>16} {'kernel':>10} {'eager':>10} {'compiled':>10} {'graph_us':>10} "
          f"{'cpu_segments':>12} {'compiled/kernel':>15}")
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        r = measure(shape, dtype, args.backward)
        print(f"{text:>16} {r['kernel']:10.1f} {r['eager']:10.1f} {r['compiled']:10.1f} "
              f"{r['graph_us']:10.1f} {r['cpu_segments']:12d} "
              f"{r['compiled'] / r['kernel']:15.1f}", flush=True)


if __name__ == "__main__":
    main()
