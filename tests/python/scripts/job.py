"""The job start the multi-process parity scripts share."""
import datetime

import torch

import torchneuron


def start(timeout_s=120):
    """One intra-op thread per rank (the same kernels as the one-process
    reference), then the "neuron" process group through torchneuron.init()
    (the launcher's variables, `timeout_s` seconds per operation); returns
    this rank's LaunchEnvironment (rank, world_size, ...). The scripts run
    under neuronrun; without a launcher's variables this is a world of one."""
    torch.set_num_threads(1)
    return torchneuron.init(timeout=datetime.timedelta(seconds=timeout_s))
