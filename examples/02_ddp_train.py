"""Example 02: data-parallel training with unchanged DistributedDataParallel.

Every rank builds the same small MLP, trains it with DDP on its shard of a
synthetic regression task, and rank 0 reports the loss and what the
gradient allreduces cost on both clocks: wall time on this machine and the
modelled time on the simulated Trainium2 fabric (torchneuron.fabric).

    neuronrun -n 16 examples/02_ddp_train.py
    neuronrun -n 4 examples/02_ddp_train.py --steps 50
    mpirun -n 4 python3 examples/02_ddp_train.py        # torchneuron.init() reads Open MPI's variables

The only line that differs from a Gloo or NCCL script is ``torchneuron.init()``
(or ``dist.init_process_group("neuron")`` after ``import torchneuron``).
"""
import argparse
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import torchneuron


def make_batch(step, rank, batch):
    """The shard of step `step` that rank `rank` trains on: y = sin(x) sums."""
    g = torch.Generator().manual_seed(step * 10007 + rank)
    x = torch.randn(batch, 64, generator=g)
    y = torch.sin(x[:, :8]).sum(dim=1, keepdim=True)
    return x, y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    env = torchneuron.init(timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    torchneuron.fabric.reset()
    first = last = None
    for step in range(args.steps):
        x, y = make_batch(step, env.rank, args.batch)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # The mean loss over every rank's shard, for the report.
        report = loss.detach().clone()
        dist.all_reduce(report, op=dist.ReduceOp.AVG)
        first = report.item() if first is None else first
        last = report.item()
        if env.rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {last:.4f}", flush=True)

    # Every rank holds the same weights: check it with one more allreduce.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = flat.clone()
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    same = torch.equal(flat, mine)
    totals = torchneuron.fabric.totals()
    if env.rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{env.world_size} ranks, {params} parameters, {args.steps} steps: "
              f"loss {first:.4f} -> {last:.4f}")
        print(f"collectives: {totals['operations']} ops, {totals['bytes'] / 2**20:.1f} MiB, "
              f"wall {totals['wall_us'] / 1e3:.1f} ms, modelled on trn2 "
              f"{totals['modelled_us'] / 1e3:.3f} ms")
    ok = same and last < first
    print(f"rank {env.rank}: weights identical on every rank: {same}; "
          f"{'ok' if ok else 'FAILED'}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
