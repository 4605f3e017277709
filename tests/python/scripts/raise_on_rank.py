"""A rank script that joins the process group, then raises on one rank while
the others block in a collective waiting for it."""
import datetime
import sys

import torch
import torch.distributed as dist

failing = int(sys.argv[1])
dist.init_process_group("gloo", init_method="env://",
                        timeout=datetime.timedelta(seconds=300))
if dist.get_rank() == failing:
    raise ValueError(f"boom on rank {failing}")
dist.all_reduce(torch.ones(4))  # never completes: the failing rank is gone
