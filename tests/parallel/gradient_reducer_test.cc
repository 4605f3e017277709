#include "neuron/parallel/gradient_reducer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../c10d/group_threads.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

using c10d::testing::RunProcessGroup;

at::Tensor Param(std::vector<std::int64_t> shape, at::ScalarType dtype = at::kFloat) {
  return at::zeros(shape, at::TensorOptions(dtype)).requires_grad_(true);
}

TEST(AssignBuckets, ReverseOrderSmallFirstBucketPerDtypeOneDtypeEach) {
  // 4 KiB of floats each; caps 8 KiB for a dtype's first bucket, then 16 KiB.
  std::vector<at::Tensor> p;
  for (int i = 0; i < 8; ++i) p.push_back(Param({1024}));
  p.push_back(Param({512}, at::kDouble));
  const auto buckets = AssignBuckets(p, 8 << 10, 16 << 10);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].dtype, at::kDouble);  // the last parameter comes first
  EXPECT_EQ(buckets[0].parameters, (std::vector<std::size_t>{8}));
  EXPECT_EQ(buckets[1].parameters, (std::vector<std::size_t>{7, 6}));
  EXPECT_EQ(buckets[2].parameters, (std::vector<std::size_t>{5, 4, 3, 2}));
  EXPECT_EQ(buckets[2].offsets, (std::vector<std::int64_t>{0, 1024, 2048, 3072}));
  EXPECT_EQ(buckets[3].parameters, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(buckets[3].elements, 2048);
}

// A two-layer model whose parameters land in three buckets (512 B first
// bucket: unused and w2; 64 B others: b1, then w1), and each rank's own batch.
struct Model {
  at::Tensor w1 = at::linspace(-1, 1, 16 * 24).view({16, 24}).requires_grad_(true);
  at::Tensor b1 = at::linspace(0, 0.5, 24).requires_grad_(true);
  at::Tensor w2 = at::linspace(1, -1, 24 * 8).view({24, 8}).requires_grad_(true);
  at::Tensor unused = at::ones({4}).requires_grad_(true);
  std::vector<at::Tensor> params() const { return {w1, b1, w2, unused}; }
  at::Tensor Loss(int rank, int micro, bool use_all = false) const {
    at::Tensor x = at::sin(at::arange(5 * 16, at::kFloat).view({5, 16}) * (rank + 1) + micro);
    at::Tensor loss = at::tanh(at::mm(x, w1) + b1).mm(w2).pow(2).mean();
    return use_all ? loss + unused.sum() * (rank + 1) : loss;
  }
};

ReducerOptions SmallBuckets() {
  ReducerOptions o;
  o.first_bucket_bytes = 512;
  o.bucket_cap_bytes = 64;
  o.names = {"w1", "b1", "w2", "unused"};
  return o;
}

// What every rank's .grad must be: the ranks' gradients (of `micros`
// micro-batches each) summed in rank order, divided by the world size.
std::vector<at::Tensor> Reference(int world, int micros, bool use_all) {
  std::vector<at::Tensor> total;
  for (int r = 0; r < world; ++r) {
    Model m;
    for (int micro = 0; micro < micros; ++micro) m.Loss(r, micro, use_all).backward();
    for (std::size_t i = 0; i < 3; ++i) {
      at::Tensor g = m.params()[i].grad();
      total.size() > i ? total[i] = total[i] + g : (total.push_back(g), total[i]);
    }
  }
  for (auto& t : total) t = t / world;
  return total;
}

void ExpectBitwise(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_TRUE(at::equal(got, want)) << what << ": max difference "
                                    << (got - want).abs().max().item<float>();
}

TEST(GradientReducer, AveragesEveryGradientInRankOrderBitwiseOverSeveralBuckets) {
  for (bool bucket_view : {false, true}) {
    const auto want = Reference(4, 1, false);
    RunProcessGroup(4, [&](::c10d::ProcessGroup& pg, int rank) {
      Model m;
      ReducerOptions o = SmallBuckets();
      o.gradient_as_bucket_view = bucket_view;
      o.find_unused_parameters = true;  // `unused` gets no gradient
      GradientReducer reducer(m.params(), c10::intrusive_ptr<::c10d::ProcessGroup>::
                                              unsafe_reclaim_from_nonowning(&pg), o);
      ASSERT_EQ(reducer.buckets().size(), 3u);
      for (int step = 0; step < 2; ++step) {
        for (auto& p : m.params()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
        reducer.PrepareForBackward();
        m.Loss(rank, 0).backward();
        const char* names[] = {"w1", "b1", "w2"};
        for (std::size_t i = 0; i < 3; ++i) {
          ExpectBitwise(m.params()[i].grad(), want[i],
                        std::string(names[i]) + " on rank " + std::to_string(rank));
        }
        EXPECT_FALSE(m.unused.grad().defined()) << "unused on every rank: left alone";
      }
      EXPECT_EQ(reducer.allreduces(), 2 * 3);
      // With bucket views the gradients live in the buckets.
      EXPECT_EQ(m.w2.grad().is_view(), bucket_view);
      EXPECT_EQ(m.w1.grad().is_view(), bucket_view);
    });
  }
}

TEST(GradientReducer, BackwardsWithoutPrepareAccumulateAndTheNextSynchronisingOneAverages) {
  const auto want = Reference(3, 2, false);
  RunProcessGroup(3, [&](::c10d::ProcessGroup& pg, int rank) {
    Model m;
    ReducerOptions o = SmallBuckets();
    o.find_unused_parameters = true;
    GradientReducer reducer(
        m.params(), c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&pg),
        o);
    m.Loss(rank, 0).backward();  // no_sync: local only
    EXPECT_EQ(reducer.allreduces(), 0);
    reducer.PrepareForBackward();
    m.Loss(rank, 1).backward();
    for (std::size_t i = 0; i < 3; ++i) {
      ExpectBitwise(m.params()[i].grad(), want[i], "parameter " + std::to_string(i));
    }
  });
}

TEST(GradientReducer, AParameterWithoutGradientIsAnErrorNamingItUnlessFindUnused) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    Model m;
    GradientReducer reducer(
        m.params(), c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&pg),
        SmallBuckets());
    reducer.PrepareForBackward();
    std::string message;
    try {
      m.Loss(rank, 0).backward();
    } catch (const std::exception& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("on rank " + std::to_string(rank) +
                           ", 1 parameter(s) received no gradient in this backward: unused"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("find_unused_parameters=True"), std::string::npos) << message;
  });
}

TEST(GradientReducer, ALocallyUnusedParameterGetsTheAverageOfTheRanksThatUsedIt) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    Model m;
    ReducerOptions o = SmallBuckets();
    o.find_unused_parameters = true;
    GradientReducer reducer(
        m.params(), c10::intrusive_ptr<::c10d::ProcessGroup>::unsafe_reclaim_from_nonowning(&pg),
        o);
    reducer.PrepareForBackward();
    m.Loss(rank, 0, /*use_all=*/rank == 1).backward();  // d/d unused = 2 on rank 1 only
    ExpectBitwise(m.unused.grad(), at::ones({4}), "unused");  // (0 + 2) / 2
  });
}

TEST(BroadcastCoalesced, EveryRankEndsWithTheRootsTensorsOfEveryDtype) {
  RunProcessGroup(3, [&](::c10d::ProcessGroup& pg, int rank) {
    std::vector<at::Tensor> t = {at::full({5}, rank, at::kFloat),
                                 at::full({2, 3}, rank * 10, at::kLong),
                                 at::full({7}, rank + 0.5, at::kDouble),
                                 at::full({3}, rank, at::kFloat).requires_grad_(true)};
    BroadcastCoalesced(t, pg, /*root=*/1, /*bucket_bytes=*/16);
    EXPECT_TRUE(at::equal(t[0], at::full({5}, 1, at::kFloat)));
    EXPECT_TRUE(at::equal(t[1], at::full({2, 3}, 10, at::kLong)));
    EXPECT_TRUE(at::equal(t[2], at::full({7}, 1.5, at::kDouble)));
    EXPECT_TRUE(at::equal(t[3].detach(), at::full({3}, 1, at::kFloat)));
  });
}

}  // namespace
}  // namespace neuron::parallel
