#include "neuron/parallel/tensor_parallel_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "../c10d/group_threads.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

using c10d::testing::RunProcessGroup;

GroupPtr Owned(::c10d::ProcessGroup& pg) {
  return GroupPtr::unsafe_reclaim_from_nonowning(&pg);
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(at::allclose(got, want, 1.3e-6, 1e-5))
      << what << ": max difference " << (got - want).abs().max().item<float>();
}

TEST(VocabParallelCrossEntropy, EqualsTheFullCrossEntropyAndItsGradientWithAPaddedVocabulary) {
  const std::int64_t vocab = 7, tokens = 5;  // 2 ranks x 4 columns: one of padding
  const at::Tensor full = at::sin(at::arange(tokens * vocab, at::kFloat).view({tokens, vocab}));
  const at::Tensor target = at::tensor({0, 3, 4, 6, 2}, at::kLong);
  at::Tensor ref_logits = full.clone().requires_grad_(true);
  at::Tensor ref = at::cross_entropy_loss(ref_logits, target, {}, at::Reduction::None);
  ref.sum().backward();
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    at::Tensor padded = at::cat({full, at::full({tokens, 1}, 100.0)}, 1);  // padding must not count
    at::Tensor mine = padded.narrow(1, rank * 4, 4).clone().requires_grad_(true);
    at::Tensor loss = VocabParallelCrossEntropy(mine, target, Owned(pg), vocab);
    ExpectClose(loss, ref.detach(), "loss on rank " + std::to_string(rank));
    loss.sum().backward();
    at::Tensor want = at::cat({ref_logits.grad(), at::zeros({tokens, 1})}, 1).narrow(1, rank * 4, 4);
    ExpectClose(mine.grad(), want, "gradient on rank " + std::to_string(rank));
  });
}

TEST(TensorParallelOps, GatherScatterAndSequenceCollectivesAreEachOthersGradients) {
  RunProcessGroup(3, [&](::c10d::ProcessGroup& pg, int rank) {
    const at::Tensor full = at::arange(6 * 4, at::kFloat).view({6, 4});
    at::Tensor x = full.clone().requires_grad_(true);
    at::Tensor mine = ScatterToGroup(x, Owned(pg), 0);  // rows [2r, 2r + 2)
    EXPECT_TRUE(at::equal(mine, full.narrow(0, 2 * rank, 2)));
    at::Tensor back = GatherFromGroup(mine, Owned(pg), 0);
    EXPECT_TRUE(at::equal(back, full));
    (back * (rank + 1)).sum().backward();
    // d/dx: own rows get this rank's factor (gather's backward keeps own chunk,
    // scatter's all-gathers the chunks): row block b holds factor b + 1.
    const at::Tensor factors = at::arange(1, 4, at::kFloat).repeat_interleave(2).unsqueeze(1);
    EXPECT_TRUE(at::equal(x.grad(), factors.expand({6, 4})));

    at::Tensor y = at::full({6, 2}, rank + 1.0).requires_grad_(true);
    at::Tensor reduced = ReduceScatterSequence(y, Owned(pg));  // rows of 1 + 2 + 3
    EXPECT_TRUE(at::equal(reduced, at::full({2, 2}, 6.0)));
    at::Tensor gathered = GatherSequence(reduced, Owned(pg));
    EXPECT_EQ(gathered.sizes(), (at::IntArrayRef{6, 2}));
    gathered.sum().backward();  // all-gather's backward reduce-scatters: 3 per element
    EXPECT_TRUE(at::equal(y.grad(), at::full({6, 2}, 3.0)));
    EXPECT_THROW(ScatterToGroup(at::zeros({4, 4}), Owned(pg), 0), InvalidUsage);
  });
}

TEST(TensorParallelOps, CopyAllReducesGradientsAndReduceAllReducesValues) {
  RunProcessGroup(2, [&](::c10d::ProcessGroup& pg, int rank) {
    at::Tensor x = at::ones({3}).requires_grad_(true);
    at::Tensor y = CopyToGroup(x, Owned(pg));
    (y * (rank + 1)).sum().backward();
    EXPECT_TRUE(at::equal(x.grad(), at::full({3}, 3.0)));
    at::Tensor z = at::full({2}, rank + 1.0).requires_grad_(true);
    at::Tensor sum = ReduceFromGroup(z, Owned(pg));
    EXPECT_TRUE(at::equal(sum, at::full({2}, 3.0)));
    sum.sum().backward();
    EXPECT_TRUE(at::equal(z.grad(), at::ones({2})));
  });
}

}  // namespace
}  // namespace neuron::parallel
