// Which dataset indices a data-parallel rank reads in an epoch: the same
// contract and the same indices as torch.utils.data.DistributedSampler
// (shuffled by torch.randperm with a generator seeded seed + epoch; padded
// by repeating the first indices, or the tail dropped with drop_last), so a
// job can switch between them without changing what each rank sees.
//
//   SamplerOptions o{.dataset_size = 1000, .replicas = 4, .rank = 1, .seed = 7};
//   std::vector<std::int64_t> mine = ShardIndices(o, /*epoch=*/3);
#pragma once

#include <cstdint>
#include <vector>

namespace neuron::parallel {

struct SamplerOptions {
  std::int64_t dataset_size = 0;
  int replicas = 1;  // data-parallel ranks
  int rank = 0;      // this rank among them
  bool shuffle = true;
  std::uint64_t seed = 0;
  // true: drop the tail so every rank gets floor(size / replicas) samples;
  // false: pad with repeated indices to ceil(size / replicas).
  bool drop_last = false;
};

// Samples per rank per epoch. Throws InvalidUsage naming the bad field.
std::int64_t SamplesPerRank(const SamplerOptions& options);

// This rank's indices for `epoch`, in the order it reads them.
std::vector<std::int64_t> ShardIndices(const SamplerOptions& options, std::uint64_t epoch);

}  // namespace neuron::parallel
