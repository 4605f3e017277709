"""torch.distributed all_to_all_single timing with uneven splits, run under
neuronrun:

    torch_alltoall.py BACKEND BYTES...

Rank r sends peer p a share of BYTES (its whole send buffer, float32)
proportional to 1 + (r + p) mod n, so every rank sends and receives uneven
splits and no two ranks' splits are alike. The first exchange of each size
is checked against the values the peers sent. Prints "BACKEND <bytes>
<microseconds per op> <busbw GB/s>" per size: the slowest rank's average
over 256 MiB worth of iterations (5 to 50) after 2 warm-up ones; busbw
follows nccl-tests' alltoall ((n-1)/n x bytes / time). BACKEND is gloo (the
peer) or neuron."""
import datetime
import sys
import time

import torch
import torch.distributed as dist


def splits(total, n, rank):
    """Elements rank sends each peer (summing to `total`), and receives."""
    def row(src):
        weights = [1 + (src + p) % n for p in range(n)]
        out = [total * w // sum(weights) for w in weights]
        out[-1] += total - sum(out)
        return out
    return row(rank), [row(src)[rank] for src in range(n)]


def check(out, n, rank, recv):
    offset = 0
    for src, count in enumerate(recv):
        want = float(src * n + rank)
        got = out[offset:offset + count]
        if count and not bool((got == want).all()):
            sys.exit(f"rank {rank}: wrong data from rank {src}")
        offset += count


def main():
    backend = sys.argv[1]
    if backend == "neuron":
        import torchneuron  # noqa: F401  registers the backend
    dist.init_process_group(backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=600))
    n, rank = dist.get_world_size(), dist.get_rank()
    for bytes_ in map(int, sys.argv[2:]):
        send, recv = splits(bytes_ // 4, n, rank)
        inp = torch.cat([torch.full((c,), float(rank * n + p)) for p, c in enumerate(send)])
        out = torch.empty(sum(recv))
        dist.all_to_all_single(out, inp, recv, send)
        check(out, n, rank, recv)
        iterations = min(50, max(5, (256 << 20) // bytes_))
        for _ in range(2):
            dist.all_to_all_single(out, inp, recv, send)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_to_all_single(out, inp, recv, send)
        us = torch.tensor([(time.perf_counter() - start) / iterations * 1e6], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            b = inp.numel() * 4
            print(f"{backend} {b} {us.item():.1f} {b / us.item() / 1e3 * (n - 1) / n:.3f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
