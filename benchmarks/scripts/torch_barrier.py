"""A rank that imports torch, joins a Gloo process group and meets the others
at a barrier: the launch cost of a real job. Reads its rank from the torchrun
variables (neuronrun) or from Open MPI's (mpirun)."""
import datetime
import os

import torch  # noqa: F401  (the import is part of what is measured)
import torch.distributed as dist

rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=300))
dist.barrier()
dist.destroy_process_group()
