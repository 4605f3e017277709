#!/usr/bin/env python3
"""The flash attention kernel (torchneuron.nki.attention) against the same
attention run as eager operations on "neuron" and as a compiled graph: each
one's modelled time on the simulated NeuronCore (the device model; the
machine's wall time does not enter), per shape.

    .venv/bin/python benchmarks/nki_attention.py [--build build]
                                                 [--shapes 1x4x512x64,1x4x2048x64]
                                                 [--dtype bfloat16] [--causal]
                                                 [--backward]

Columns (with --backward, forward and backward): kernel (its list
schedule's time; with --backward flash_attention_lse's and
flash_attention_backward's), eager_sdpa (F.scaled_dot_product_attention
on "neuron": one eager op), eager_math (q @ k.T * scale, the causal mask,
softmax, @ v as eager ops), compiled (torch.compile(backend="neuron") of the
math form, its second call; cpu_segments counts the compiler's warnings of
parts it ran on the CPU, priced as fallbacks). Each figure is what the run
charged to the rank's compute clock (fabric.clock()["charged_us"]), the
kernel's its list schedule's time. docs/nki.md records a run.
"""
import argparse
import math
import os
import sys
import warnings


def math_attention(q, k, v, mask):
    """softmax(q @ k.T / sqrt(D), masked where `mask` (None: no mask)) @ v."""
    import torch
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def charged(fn):
    from torchneuron import fabric
    before = fabric.clock()["charged_us"]
    fn()
    return fabric.clock()["charged_us"] - before


def step(fn, inputs, backward):
    """fn(*inputs), and its backward when `backward` (inputs need grad)."""
    def run():
        out = fn(*inputs)
        if backward:
            out.backward(out.new_ones(out.shape))
    return run


def measure(shape, dtype, causal, backward):
    import torch
    import torch.nn.functional as F
    from torchneuron.nki.attention_backward import flash_attention_backward
    from torchneuron.nki.attention import flash_attention, flash_attention_lse
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=dtype).to("neuron").requires_grad_(backward)
               for _ in range(3))
    n = shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1).to("neuron") if causal else None
    if backward:
        fwd = flash_attention_lse.run(q, k, v, causal=causal)
        out, lse = fwd.outputs
        bwd = flash_attention_backward.run(q, k, v, out, torch.ones_like(out), lse,
                                           causal=causal)
        rows = {"kernel": fwd.time_us + bwd.time_us}
    else:
        rows = {"kernel": flash_attention.run(q, k, v, causal=causal).time_us}
    sdpa = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa
    rows["eager_sdpa"] = charged(step(sdpa, (q, k, v), backward))
    rows["eager_math"] = charged(step(math_attention, (q, k, v, mask), backward))
    compiled = torch.compile(math_attention, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(compiled, (q, k, v, mask), backward)()  # compiles
    rows["compiled"] = charged(step(compiled, (q, k, v, mask), backward))
    rows["cpu_segments"] = sum("on the CPU" in str(w.message) for w in caught)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--shapes", default="1x4x512x64,1x4x2048x64")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--backward", action="store_true", help="forward and backward")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    dtype = getattr(torch, args.dtype)
    print(f"shape (B x H x S x D), {args.dtype}, causal={args.causal}, "
          f"backward={args.backward}: modelled us")
    print(f"{'shape':>16} {'kernel':>10} {'eager_sdpa':>11} {'eager_math':>11} {'compiled':>10} "
          f"{'cpu_segments':>12}")
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        r = measure(shape, dtype, args.causal, args.backward)
        print(f"{text:>16} {r['kernel']:10.1f} {r['eager_sdpa']:11.1f} {r['eager_math']:11.1f} "
              f"{r['compiled']:10.1f} {r['cpu_segments']:12d}")


if __name__ == "__main__":
    main()
