#include "neuron/parallel/token_data.h"

#include <ATen/ATen.h>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

// SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
// generators", 2014).
std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

at::Tensor SyntheticTokens(const TokenDataOptions& o) {
  NEURON_CHECK(o.sequences >= 0 && o.length >= 1 && o.vocab >= 2,
               "synthetic tokens: need sequences >= 0, length >= 1, vocab >= 2; got ",
               o.sequences, ", ", o.length, ", ", o.vocab);
  at::Tensor tokens = at::empty({o.sequences, o.length + 1}, at::kLong);
  auto* t = tokens.data_ptr<std::int64_t>();
  const auto vocab = static_cast<std::uint64_t>(o.vocab);
  std::uint64_t state = o.seed;
  for (std::int64_t s = 0; s < o.sequences; ++s) {
    const std::uint64_t rule = SplitMix64(state) % 8;
    const std::uint64_t a = 1 + 2 * rule, b = 3 + rule;
    std::uint64_t x = SplitMix64(state) % vocab;
    for (std::int64_t i = 0; i <= o.length; ++i) {
      const std::uint64_t noise = SplitMix64(state);
      *t++ = static_cast<std::int64_t>(noise % 16 == 0 ? (noise >> 8) % vocab : x);
      x = (a * x + b) % vocab;
    }
  }
  return tokens;
}

ShardedBatches::ShardedBatches(at::Tensor dataset, SamplerOptions sampler,
                               std::int64_t batch_size, bool drop_last_batch)
    : dataset_(std::move(dataset)), sampler_(sampler), batch_size_(batch_size),
      drop_last_batch_(drop_last_batch) {
  NEURON_CHECK(dataset_.dim() >= 1, "sharded batches: the dataset needs a sample dimension");
  NEURON_CHECK(batch_size_ >= 1, "sharded batches: batch size must be >= 1, got ", batch_size_);
  sampler_.dataset_size = dataset_.size(0);
  SamplesPerRank(sampler_);  // validates
}

std::int64_t ShardedBatches::size() const {
  const std::int64_t n = SamplesPerRank(sampler_);
  return drop_last_batch_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

at::Tensor ShardedBatches::Get(std::uint64_t epoch, std::int64_t batch) {
  NEURON_CHECK(batch >= 0 && batch < size(), "sharded batches: batch ", batch, " outside 0..",
               size() - 1, " of epoch ", epoch);
  if (epoch != cached_epoch_) {
    indices_ = ShardIndices(sampler_, epoch);
    cached_epoch_ = epoch;
  }
  const std::int64_t begin = batch * batch_size_;
  const std::int64_t end =
      std::min<std::int64_t>(begin + batch_size_, static_cast<std::int64_t>(indices_.size()));
  const at::Tensor index =
      at::from_blob(indices_.data() + begin, {end - begin}, at::kLong).clone();
  return dataset_.index_select(0, index);
}

}  // namespace neuron::parallel
