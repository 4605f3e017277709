#include "neuron/parallel/step_memory.h"

#include <gtest/gtest.h>

#include "neuron/runtime/error.h"

namespace neuron::parallel {
namespace {

proto::StepCapture Capture(int stages) {
  proto::StepCapture c;
  for (int s = 0; s < stages; ++s) c.add_stage_parameters(1000000);
  c.set_layer_activation_bytes(1000);
  c.set_embed_activation_bytes(100);
  c.set_head_activation_bytes(10);
  return c;
}

TEST(StepMemory, ZeroStagesDivideOptimizerStateThenGradientsThenWeights) {
  const auto c = Capture(1);
  MemoryLayout l;
  l.dp = 4;
  const double p = 1e6;
  // bf16-mixed: 2 bytes of weights, 12 of fp32 master weights and moments, 4 of gradients.
  for (int zero = 0; zero <= 3; ++zero) {
    l.zero = zero;
    const StepMemory m = EstimateStepMemory(c, l, 0);
    EXPECT_DOUBLE_EQ(m.weights_and_optimizer,
                     p * 2 / (zero >= 3 ? 4 : 1) + p * 12 / (zero >= 1 ? 4 : 1)) << zero;
    EXPECT_DOUBLE_EQ(m.gradients, p * 4 / (zero >= 2 ? 4 : 1)) << zero;
  }
  l.zero = 0;
  l.dtype = "fp32";
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 0).weights_and_optimizer, p * 12);
  l.dtype = "bf16";
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 0).gradients, p * 2);
  l.dtype = "fp16";
  EXPECT_THROW(EstimateStepMemory(c, l, 0), InvalidUsage);
}

// Expert parallelism carves ep out of dp: the experts (held by dp / ep
// replicas) shard their optimizer state, gradients and weights over those
// replicas only, the rest over every dp rank.
TEST(StepMemory, ExpertParametersShardOverTheirReplicasOnly) {
  auto c = Capture(1);  // 1e6 parameters on the rank, 0.75e6 of them its experts'
  c.add_stage_expert_parameters(750000);
  MemoryLayout l;
  l.dp = 8;
  l.ep = 4;  // 2 replicas of each expert
  const double dense = 250000, experts = 750000;
  for (int zero = 0; zero <= 3; ++zero) {
    l.zero = zero;
    auto over = [&](double n, double ranks, bool shard) { return shard ? n / ranks : n; };
    const StepMemory m = EstimateStepMemory(c, l, 0);
    EXPECT_DOUBLE_EQ(m.weights_and_optimizer,
                     2 * (over(dense, 8, zero >= 3) + over(experts, 2, zero >= 3)) +
                         12 * (over(dense, 8, zero >= 1) + over(experts, 2, zero >= 1)))
        << zero;
    EXPECT_DOUBLE_EQ(m.gradients,
                     4 * (over(dense, 8, zero >= 2) + over(experts, 2, zero >= 2)))
        << zero;
  }
  // ep = dp: every rank holds its own experts, sharded over no one.
  l.ep = 8;
  l.zero = 1;
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 0).weights_and_optimizer,
                   2e6 + 12 * (dense / 8 + experts));
  l.ep = 3;
  EXPECT_THROW(EstimateStepMemory(c, l, 0), InvalidUsage);
}

TEST(StepMemory, OneFOneBHoldsPipelineMinusStageMicrobatches) {
  const auto c = Capture(4);
  MemoryLayout l;
  l.pp = 4;
  l.microbatches = 16;
  l.stage_layers = 3;
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 0).activations, 4 * (3 * 1000 + 100));
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 1).activations, 3 * 3000);
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 3).activations, 1 * (3000 + 10));
  l.microbatches = 2;  // fewer microbatches than stages: all of them
  EXPECT_DOUBLE_EQ(EstimateStepMemory(c, l, 0).activations, 2 * 3100);
  EXPECT_THROW(EstimateStepMemory(c, l, 4), InvalidUsage);
}

}  // namespace
}  // namespace neuron::parallel
