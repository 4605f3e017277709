"""Data for data-parallel training: a sampler that shards any dataset over the
data-parallel ranks, and a synthetic token dataset (no downloads)."""
import torch
import torch.distributed as dist
import torch.utils.data

from .. import _C
from . import mesh


def _data_parallel_coordinates():
    if mesh.is_initialized():
        layout = mesh.get_layout()
        return layout.dp, layout.dp_rank
    if dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class DistributedSampler(torch.utils.data.Sampler):
    """Shards a dataset over the data-parallel ranks.

    The same contract and the same indices as
    torch.utils.data.DistributedSampler (shuffled with torch.randperm seeded
    seed + epoch; padded by repeating the first indices, or the tail dropped
    with drop_last), computed by neuron::parallel::ShardIndices. The replicas
    default to the data-parallel group of torchneuron.parallel.initialize, or
    the default group. Call set_epoch(e) before each epoch.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        replicas, my_rank = _data_parallel_coordinates()
        self.num_replicas = replicas if num_replicas is None else num_replicas
        self.rank = my_rank if rank is None else rank
        self.size, self.shuffle, self.seed, self.drop_last = len(dataset), shuffle, seed, drop_last
        self.epoch = 0
        self.num_samples = _C._samples_per_rank(self.size, self.num_replicas, self.rank,
                                                shuffle, seed, drop_last)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        return iter(_C._shard_indices(self.size, self.num_replicas, self.rank, self.shuffle,
                                      self.seed, self.drop_last, self.epoch))


class SyntheticTokenDataset(torch.utils.data.Dataset):
    """(inputs, targets) int64 pairs of `length` tokens, targets shifted by one.

    Each sequence follows t[i+1] = (a * t[i] + b) mod vocab with one of 8 rules,
    one token in 16 replaced by noise (neuron::parallel::SyntheticTokens): a
    small model learns it in a few steps. Deterministic in (sequences, length,
    vocab, seed) on every machine.
    """

    def __init__(self, sequences=256, length=64, vocab=256, seed=0):
        self.tokens = _C._synthetic_tokens(sequences, length, vocab, seed)
        self.vocab = vocab

    def __len__(self):
        return self.tokens.shape[0]

    def __getitem__(self, i):
        row = self.tokens[i]
        return row[:-1], row[1:]
