// Training data for the examples and tests, made here (no downloads): a
// synthetic token dataset, and a loader that batches a data-parallel rank's
// share of any tensor dataset for C++ trainers.
//
//   at::Tensor tokens = SyntheticTokens({.sequences = 512, .length = 64, .vocab = 256});
//   ShardedBatches batches(tokens, {.replicas = dp, .rank = dp_rank, .seed = 1}, 8);
//   for (std::int64_t b = 0; b < batches.size(); ++b) {
//     at::Tensor batch = batches.Get(epoch, b);  // [8, 65]
//   }
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>

#include "neuron/parallel/distributed_sampler.h"

namespace neuron::parallel {

struct TokenDataOptions {
  std::int64_t sequences = 256;
  std::int64_t length = 64;  // tokens per sequence fed to the model
  std::int64_t vocab = 256;
  std::uint64_t seed = 0;
};

// int64 [sequences, length + 1] (inputs are [:, :-1], targets [:, 1:]):
// each sequence follows t[i+1] = (a * t[i] + b) mod vocab with its own (a, b)
// drawn from 8 rules, plus one token in 16 replaced by noise, so a small
// model's loss falls within a few steps yet never reaches zero. The same
// options give the same tokens on every machine (SplitMix64, not torch's RNG).
at::Tensor SyntheticTokens(const TokenDataOptions& options);

// Batches of a rank's share of `dataset` (samples along dim 0), in
// ShardIndices order for the epoch. The sampler's dataset_size is set from
// the dataset; a final short batch is kept unless drop_last.
class ShardedBatches {
 public:
  ShardedBatches(at::Tensor dataset, SamplerOptions sampler, std::int64_t batch_size,
                 bool drop_last_batch = false);
  std::int64_t size() const;  // batches per epoch
  at::Tensor Get(std::uint64_t epoch, std::int64_t batch);  // InvalidUsage past the end

 private:
  at::Tensor dataset_;
  SamplerOptions sampler_;
  std::int64_t batch_size_;
  bool drop_last_batch_;
  std::uint64_t cached_epoch_ = ~0ull;
  std::vector<std::int64_t> indices_;
};

}  // namespace neuron::parallel
