#!/usr/bin/env python3
"""The GPT block (torchneuron.models.gpt.Block) compiled twice with
torch.compile(backend="neuron"): with the compiler's own lowering of its
causal attention (batched matmuls, the mask, softmax) and with the flash
attention kernel (torchneuron.nki.attention_op.attention, one nki.kernel
node of the plan, priced by the kernel's schedule) in its place. Prints
each compiled graph's modelled time (the plan's: the device model's
figures, the machine's wall time does not enter), the ratio, each engine's
busy time, and the plan's bytes: what its DMAs move between HBM and the
chip (spills and reloads among them) and what the kernel nodes move
themselves. Without --backward the block runs under no_grad (an inference
graph); with it, a training step's forward and backward graphs.

    .venv/bin/python benchmarks/nki_gpt_block.py [--build build] [--seq 512,1024]
                                                 [--dim 256] [--heads 4]
                                                 [--dtype bfloat16] [--backward]

A plan the compiler refuses (a graph run on the CPU instead) is reported
as such, with no figure. docs/performance.md records a run.
"""
import argparse
import os
import re
import sys
import warnings


def kernel_attention_forward(self, x):
    """models.gpt.Attention.forward with the attention kernel in place of
    the batched matmuls, the mask and softmax (no attention dropout)."""
    from torchneuron.nki.attention_op import attention
    qkv = self.qkv(x)
    s, b, _ = qkv.shape
    q, k, v = qkv.view(s, b, self.heads, 3, self.head_dim).permute(3, 1, 2, 0, 4).unbind(0)
    y = attention(q, k, v, causal=True)  # [b, heads, s, head_dim]
    return self.proj(y.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim))


def plan_bytes(graph):
    """(bytes the plan's DMAs move, of which spills and reloads, bytes its
    custom kernels move) from the plan's text."""
    dma = spill = kernel = 0
    for block in graph.plan_text().split("\ninstructions {")[1:]:
        block = block.split("\n}\n")[0]  # the instruction's own fields
        moved = re.search(r"\n\s*bytes: (\d+)", block)
        moved = int(moved.group(1)) if moved else 0
        if "op: OP_CUSTOM_KERNEL" in block:
            kernel += moved
        elif "engine: DMA" in block:
            dma += moved
            spill += moved if "spill: true" in block else 0
    return dma, spill, kernel


def compiled_rows(prefix):
    """The compiled graphs named `prefix`*: (name, modelled us, bytes, kernels)."""
    from torchneuron import compiler
    with compiler._lock:
        entries = [e for e in compiler._metrics if e["name"].startswith(prefix)]
    rows = []
    for e in entries:
        if e.get("graph") is None:
            rows.append((e["name"], None, None, e.get("fallback_reason", "")))
            continue
        info = e["graph"].info()
        rows.append((e["name"], info["modelled_us"], plan_bytes(e["graph"]),
                     {"busy": info["engine_us"],
                      "kernels": {k["op"]: k["time_us"] for k in e.get("kernels", [])}}))
    return rows


def measure(seq, dim, heads, dtype, backward, with_kernel):
    """Compiles and runs the block twice; returns compiled_rows of its graphs."""
    import torch
    import torchneuron
    from torchneuron.models.gpt import Block, GPTConfig
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block(GPTConfig(vocab_size=64, seq_len=seq, dim=dim, heads=heads)).to(dtype)
    if with_kernel:
        block.attn.forward = kernel_attention_forward.__get__(block.attn)
    x = torch.randn(seq, 1, dim, dtype=dtype, requires_grad=backward)
    compiled = torch.compile(block, backend="neuron")
    before = len(torchneuron.compiler.metrics())
    with warnings.catch_warnings(), torch.set_grad_enabled(backward):
        warnings.simplefilter("ignore")  # a refused plan is reported below
        for _ in range(2):  # forward only: an inference graph
            y = compiled(x)
            if backward:
                y.float().sum().backward()
    names = {r["name"] for r in torchneuron.compiler.metrics()[before:]}
    return [r for p in sorted(names) for r in compiled_rows(p) if r[0] == p][:2], y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    p.add_argument("--seq", default="512,1024")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--backward", action="store_true", help="forward and backward graphs")
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    print(f"GPT block, dim {args.dim}, {args.heads} heads, batch 1, {args.dtype}, causal, "
          f"{'training forward and backward' if args.backward else 'inference'}: per "
          f"compiled graph its modelled us, each engine's busy us, MB moved by its DMAs "
          f"(spills and reloads among them) and by its kernel nodes, the kernels' us")
    for seq in (int(s) for s in args.seq.split(",")):
        results = {}
        for label, with_kernel in (("lowering", False), ("kernel", True)):
            rows, out = measure(seq, args.dim, args.heads, dtype, args.backward, with_kernel)
            results[label] = (rows, out)
            for name, us, moved, extra in rows:
                if us is None:
                    print(f"S={seq:5d} {label:>8} {name:24} refused: {extra[:120]}")
                    continue
                dma, spill, kernel = (b / 1e6 for b in moved)
                busy = " ".join(f"{e} {t:.0f}" for e, t in extra["busy"].items())
                kernels = ", ".join(f"{k} {t:.1f} us" for k, t in extra["kernels"].items())
                print(f"S={seq:5d} {label:>8} {name:24} {us:8.1f} us  busy us: {busy}  "
                      f"DMA {dma:.2f} MB (spilled {spill:.2f})  kernels {kernel:.2f} MB "
                      f"{kernels}")
        lowering, kernel = (results[k][0] for k in ("lowering", "kernel"))
        if all(r[1] is not None for r in lowering + kernel) and len(lowering) == len(kernel):
            total_l, total_k = (sum(r[1] for r in rows) for rows in (lowering, kernel))
            print(f"S={seq:5d} step: lowering {total_l:.1f} us, kernel {total_k:.1f} us, "
                  f"lowering / kernel {total_l / total_k:.2f}x")
        diff = (results["lowering"][1].float() - results["kernel"][1].float()).abs().max()
        print(f"S={seq:5d} outputs' largest difference {diff.item():.3g}")


if __name__ == "__main__":
    main()
