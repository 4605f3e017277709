#include "neuron/parallel/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>

#include <numeric>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

void Check(const SamplerOptions& o) {
  NEURON_CHECK(o.replicas >= 1, "distributed sampler: replicas must be >= 1, got ", o.replicas);
  NEURON_CHECK(o.rank >= 0 && o.rank < o.replicas, "distributed sampler: rank ", o.rank,
               " outside 0..", o.replicas - 1);
  NEURON_CHECK(o.dataset_size >= 0, "distributed sampler: dataset size must be >= 0, got ",
               o.dataset_size);
}

}  // namespace

std::int64_t SamplesPerRank(const SamplerOptions& o) {
  Check(o);
  const std::int64_t n = o.dataset_size, r = o.replicas;
  // torch's formulas: ceil((n - r) / r) when dropping a ragged tail, else ceil(n / r).
  if (o.drop_last && n % r != 0) return n < r ? 0 : (n - r + r - 1) / r;
  return (n + r - 1) / r;
}

std::vector<std::int64_t> ShardIndices(const SamplerOptions& o, std::uint64_t epoch) {
  const std::int64_t per_rank = SamplesPerRank(o);
  const std::int64_t total = per_rank * o.replicas;
  std::vector<std::int64_t> indices(static_cast<std::size_t>(o.dataset_size));
  if (o.shuffle) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + epoch);
    const at::Tensor perm = at::randperm(o.dataset_size, generator, at::kLong);
    const auto* p = perm.data_ptr<std::int64_t>();
    std::copy(p, p + o.dataset_size, indices.begin());
  } else {
    std::iota(indices.begin(), indices.end(), 0);
  }
  if (!indices.empty()) {  // pad by repeating from the start, as often as needed
    for (std::size_t i = 0; static_cast<std::int64_t>(indices.size()) < total; ++i) {
      indices.push_back(indices[i]);
    }
  }
  indices.resize(static_cast<std::size_t>(total));
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(per_rank));
  for (std::int64_t i = o.rank; i < total; i += o.replicas) {
    mine.push_back(indices[static_cast<std::size_t>(i)]);
  }
  return mine;
}

}  // namespace neuron::parallel
