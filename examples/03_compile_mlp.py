"""Example 03: train an MLP with its forward and backward compiled for the
simulated NeuronCore.

torch.compile(model, backend="neuron") captures the forward (TorchDynamo),
AOTAutograd splits it into forward and backward graphs, and the "neuron"
backend compiles both through the compile cache and runs them on the
runtime's executor:
the numbers are computed on the CPU, the time is what the plan would take
on a Trainium2 NeuronCore. The script checks the compiled model against
eager PyTorch and prints what the compiler reports per graph.

    .venv/bin/python examples/03_compile_mlp.py           # PYTHONPATH=build/python
    neuronrun -n 1 examples/03_compile_mlp.py             # neuronrun sets PYTHONPATH
"""
import sys

import torch
import torch.nn as nn

import torchneuron


def mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def main() -> int:
    torch.manual_seed(0)
    eager = mlp()
    model = mlp()
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(20):
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        target = nn.functional.one_hot(y, 10).float()
        losses = []
        for net, opt in zip((compiled, eager), opts):
            opt.zero_grad()
            loss = ((net(x) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[0] - losses[1]) / abs(losses[1]))
        if step % 5 == 0 or step == 19:
            print(f"step {step:2d}  loss compiled {losses[0]:.6f}  eager {losses[1]:.6f}")
    for row in torchneuron.compiler.metrics():
        print(f"{row['name']}: {row['nodes_after']} nodes, SBUF {row['sbuf_bytes']} bytes, "
              f"modelled {row['modelled_us']:.2f} us on a NeuronCore-v3, MFU {row['mfu']:.4f}, "
              f"graph id {row['graph_id'][:12]}")
    print("compile cache:", torchneuron.compiler.cache_counters())
    ok = worst <= 1e-5
    print(f"largest relative loss difference {worst:.2e}: {'ok' if ok else 'TOO LARGE'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
