"""Example 01: the smallest distributed job.

Every rank joins a torch.distributed process group from the environment
neuronrun gives it (env://), all-reduces a tensor, checks the result against
the closed form, meets the others at a barrier and prints one line.

    neuronrun -n 16 examples/01_allreduce_barrier.py
    neuronrun -n 4 examples/01_allreduce_barrier.py --numel 1048576

The process group uses the "neuron" backend (``import torchneuron``
registers it); ``--backend gloo`` runs the same script on torch's Gloo.
"""
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1024,
                        help="elements in the all-reduced tensor")
    parser.add_argument("--backend", default="neuron", help="torch.distributed backend")
    args = parser.parse_args()
    if args.backend == "neuron":
        import torchneuron  # noqa: F401  registers the "neuron" backend

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=120))

    # Rank r contributes r + 1 everywhere: the sum is world * (world + 1) / 2.
    tensor = torch.full((args.numel,), float(rank + 1))
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(tensor == expected))
    dist.barrier()

    chip = os.environ.get("NEURON_CHIP_INDEX", "?")
    print(f"rank {rank}/{world} on chip {chip}: all_reduce of {args.numel} floats = "
          f"{tensor[0].item():.0f}, expected {expected:.0f}: {'ok' if ok else 'WRONG'}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
