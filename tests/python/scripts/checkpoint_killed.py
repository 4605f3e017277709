#!/usr/bin/env python3
"""A save killed half-way leaves the previous checkpoint whole.

    neuronrun -n 2 tests/python/scripts/checkpoint_killed.py --dir DIR

Two data-parallel ranks, ZeRO-2, a tiny GPT. Step 1 is saved into DIR
(complete) and its consolidated state written to DIR/../expected.pt by
rank 0. After another step a second save into the same DIR starts, and rank
1 dies (os._exit(9)) right after writing its shard file, before the new
manifest: the job fails. The pytest side then checks that DIR still loads,
as step 1's state.
"""
import argparse
import os

import torch

import torchneuron  # noqa: F401
import torchneuron.parallel as parallel
from torchneuron import _C
from torchneuron.models.gpt import GPT, GPTConfig

import job  # tests/python/scripts/job.py: the shared job start


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    args = p.parse_args()
    rank = job.start(timeout_s=60).rank
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=20, seq_len=4, dim=16, heads=2, layers=1), tp_group=False)
    zero = parallel.FullyShardedDataParallel(model, stage=2)
    opt = torch.optim.AdamW(zero.parameters(), lr=0.1)
    tokens = torch.randint(0, 20, (2, 4), generator=torch.Generator().manual_seed(rank))

    def step():
        opt.zero_grad()
        zero(tokens, tokens).backward()
        opt.step()

    step()
    parallel.save_checkpoint(args.dir, model, [zero], opt, step=1)
    full = zero.full_state_dict()
    if rank == 0:
        torch.save(full, os.path.join(os.path.dirname(args.dir), "expected.pt"))
    step()
    write = _C._write_shard_file

    def write_then_die(path, pieces):
        digest = write(path, pieces)
        if rank == 1:
            print(f"dying after writing {os.path.basename(path)}", flush=True)
            os._exit(9)
        return digest

    _C._write_shard_file = write_then_die
    parallel.save_checkpoint(args.dir, model, [zero], opt, step=2)
    raise AssertionError("the second save finished")


if __name__ == "__main__":
    main()
