#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "neuron/parallel/distributed_sampler.h"
#include "neuron/parallel/token_data.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

TEST(DistributedSampler, RanksCoverTheDatasetDisjointlyPaddedOrTrimmed) {
  for (bool drop_last : {false, true}) {
    for (int replicas : {1, 3, 4, 7}) {
      const std::int64_t size = 50;
      std::multiset<std::int64_t> all;
      for (int r = 0; r < replicas; ++r) {
        const SamplerOptions o{size, replicas, r, true, 7, drop_last};
        const auto mine = ShardIndices(o, 2);
        EXPECT_EQ(static_cast<std::int64_t>(mine.size()), SamplesPerRank(o));
        all.insert(mine.begin(), mine.end());
      }
      const std::int64_t per = drop_last ? size / replicas : (size + replicas - 1) / replicas;
      EXPECT_EQ(static_cast<std::int64_t>(all.size()), per * replicas);
      std::set<std::int64_t> distinct(all.begin(), all.end());
      // Padding repeats at most replicas - 1 indices; dropping loses at most that many.
      EXPECT_GE(static_cast<std::int64_t>(distinct.size()), size - (replicas - 1));
      for (std::int64_t i : distinct) EXPECT_TRUE(i >= 0 && i < size);
    }
  }
}

TEST(DistributedSampler, DeterministicPerSeedAndEpochAndDifferentAcrossEpochs) {
  const SamplerOptions o{100, 4, 1, true, 3, false};
  EXPECT_EQ(ShardIndices(o, 5), ShardIndices(o, 5));
  EXPECT_NE(ShardIndices(o, 5), ShardIndices(o, 6));
  SamplerOptions in_order = o;
  in_order.shuffle = false;
  EXPECT_EQ(ShardIndices(in_order, 9), (std::vector<std::int64_t>(
                                             [] {
                                               std::vector<std::int64_t> v;
                                               for (int i = 1; i < 100; i += 4) v.push_back(i);
                                               return v;
                                             }())));
  EXPECT_THROW(ShardIndices({10, 2, 2, true, 0, false}, 0), InvalidUsage);
  EXPECT_THROW(ShardIndices({10, 0, 0, true, 0, false}, 0), InvalidUsage);
}

TEST(SyntheticTokens, SameOptionsSameTokensAndTheyFollowTheirRule) {
  const TokenDataOptions o{64, 32, 97, 11};
  const at::Tensor a = SyntheticTokens(o), b = SyntheticTokens(o);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{64, 33}));
  EXPECT_GE(a.min().item<std::int64_t>(), 0);
  EXPECT_LT(a.max().item<std::int64_t>(), 97);
  TokenDataOptions other = o;
  other.seed = 12;
  EXPECT_FALSE(at::equal(a, SyntheticTokens(other)));
}

TEST(ShardedBatches, BatchesARanksShareInSamplerOrder) {
  const at::Tensor data = at::arange(20, at::kLong).view({20, 1}) * 10;
  const SamplerOptions sampler{0, 3, 2, true, 4, false};
  ShardedBatches batches(data, sampler, 3);
  SamplerOptions sized = sampler;
  sized.dataset_size = 20;
  const auto indices = ShardIndices(sized, 1);  // 7 per rank: batches of 3, 3, 1
  ASSERT_EQ(batches.size(), 3);
  std::vector<std::int64_t> seen;
  for (std::int64_t b = 0; b < batches.size(); ++b) {
    const at::Tensor batch = batches.Get(1, b);
    for (std::int64_t i = 0; i < batch.size(0); ++i) seen.push_back(batch[i][0].item<std::int64_t>() / 10);
  }
  EXPECT_EQ(seen, indices);
  EXPECT_THROW(batches.Get(1, 3), InvalidUsage);
  EXPECT_EQ(ShardedBatches(data, sampler, 3, /*drop_last_batch=*/true).size(), 2);
}

}  // namespace
}  // namespace neuron::parallel
