"""A tensor-parallel GPT (DTensor's parallelize_module over "tp") compiled
with torch.compile(backend="neuron") on the "neuron" device trains to the
same losses and parameters as the same model run eagerly; the collectives
run between the compiled segments (the graph is split at them)."""
import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import torchneuron
from torchneuron.models.plain_gpt import GPT, PlainGPTConfig, apply_tensor_parallel, loss_fn


def strict_mlp(mesh):
    """fullgraph=True: every operator on the device, the collectives between
    the segments (not a fallback, so no error)."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(2)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    eager = parallelize_module(copy.deepcopy(mlp).to("neuron"), mesh["tp"], plan)
    strict = parallelize_module(mlp.to("neuron"), mesh["tp"], plan)
    x = torch.randn(4, 16).to("neuron")
    out = torch.compile(strict, backend="neuron", fullgraph=True)(x)
    torch.testing.assert_close(out, eager(x))


def main():
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),), mesh_dim_names=("tp",))
    cfg = PlainGPTConfig(vocab=64, seq=16, dim=32, heads=4, layers=2)
    torch.manual_seed(0)
    base = GPT(cfg)
    models = [apply_tensor_parallel(copy.deepcopy(base).to("neuron"), mesh["tp"])
              for _ in range(2)]
    compiled = torch.compile(models[0], backend="neuron")
    # foreach=False: the plain (layer norm) and DTensor parameters mix.
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, foreach=False) for m in models]
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        tokens = torch.randint(0, cfg.vocab, (4, cfg.seq + 1), generator=g).to("neuron")
        losses = []
        for model, opt in zip((compiled, models[1]), opts):
            opt.zero_grad()
            loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1]), (step, losses)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p.full_tensor() if hasattr(p, "full_tensor") else p,
                                   q.full_tensor() if hasattr(q, "full_tensor") else q,
                                   rtol=1e-4, atol=1e-5)
    entries = torchneuron.compiler.metrics()
    on_cpu = {op for e in entries for op in e["fallback_ops"]}
    between = {op for e in entries for op in e.get("collectives", {})}
    # On the CPU only the vocabulary-parallel embedding's index arithmetic
    # (integers: the engines compute floats); matmuls, attention, norms and
    # the loss on the device.
    assert on_cpu <= {"aten.sub", "aten.lt.Scalar", "aten.ge.Scalar", "aten.bitwise_or",
                      "aten.index_put", "aten.scalar_tensor", "aten.lift_fresh_copy",
                      "aten.split"}, on_cpu
    assert {"_c10d_functional.all_reduce", "_c10d_functional.wait_tensor"} <= between, between
    assert sum(1 for e in entries if e["compiled"] and not e["fallback_ops"]) >= 10, entries
    strict_mlp(mesh)
    print(f"ok dynamo tp: rank {dist.get_rank()}, losses {losses}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
