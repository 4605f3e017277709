"""torch.distributed allreduce timing, run under neuronrun:

    torch_allreduce.py BACKEND BYTES...

prints "BACKEND <bytes> <microseconds per op> <busbw GB/s>" per size, the
slowest rank's average, float32 sum; 200 iterations after 20 warm-up for
sizes up to 64 KiB, else 256 MiB worth (5 to 50) after 2. BACKEND is gloo
(the peer) or neuron (with NEURON_SHARED_TENSORS=1 in the environment, the
tensors live in registered shared memory)."""
import datetime
import sys
import time

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "neuron":
    import torchneuron  # noqa: F401  registers the backend
dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=600))
n = dist.get_world_size()
for bytes_ in map(int, sys.argv[2:]):
    t = torch.ones(max(bytes_ // 4, 1))
    iterations, warmup = ((200, 20) if bytes_ <= 64 << 10 else
                          (min(50, max(5, (256 << 20) // bytes_)), 2))
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(t)
    us = torch.tensor([(time.perf_counter() - start) / iterations * 1e6], dtype=torch.float64)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        b = t.numel() * 4
        print(f"{backend} {b} {us.item():.1f} {b / us.item() / 1e3 * 2 * (n - 1) / n:.3f}",
              flush=True)
dist.destroy_process_group()
