#include "neuron/parallel/predicted_job.h"

#include <gtest/gtest.h>

#include "neuron/parallel/pipeline_trace_scaling.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/fabric/trace_scaling.h"
#include "neuron/runtime/topology.h"

namespace neuron::parallel {
namespace {

using runtime::FabricModel;
using runtime::Topology;

constexpr std::int64_t kParameters = 1000000;

// Phases of fixed times: a layer's forward 10 us (+2 us of tensor-parallel
// collectives), backward 20; embedding 1 / 2, head 3 / 4, optimizer 50.
StepCosts Costs() {
  StepCosts c;
  auto set = [&c](const std::string& name, double us, double tp = 0) {
    c[name].compute_us = us;
    c[name].tp_collective_us = tp;
  };
  set("layer_forward", 10, 2);
  set("layer_backward", 20);
  set("embed_forward", 1);
  set("embed_backward", 2);
  set("head_forward", 3);
  set("head_backward", 4);
  set(OptimizerPhase(kParameters), 50);
  return c;
}

proto::StepCapture Capture(int stages) {
  proto::StepCapture capture;
  for (int s = 0; s < stages; ++s) capture.add_stage_parameters(kParameters);
  return capture;
}

FabricModel Fabric(int ranks) {
  const Topology t = Topology::Default();
  return FabricModel(t, runtime::PlaceRanks(t, {static_cast<std::uint32_t>(ranks)}));
}

double Collective(const FabricModel& f, const char* kind, double bytes, std::vector<int> group) {
  return runtime::ModelCollective(f, kind, bytes, group, 0, runtime::ConfiguredFabricAlgorithm())
      .micros;
}

TEST(PredictedJob, GradientAccumulationRunsEveryMicrobatchThenTheOptimizer) {
  PredictedLayout l;
  l.microbatches = 3;
  l.stage_layers = {2};
  const auto traces = PredictedTraces(Costs(), Capture(1), l);
  ASSERT_EQ(traces.size(), 1u);
  const auto r = runtime::ReplayTraces(traces, Fabric(1));
  ASSERT_EQ(r.steps.size(), 1u);
  const double microbatch = 1 + 2 * 12 + 3 + 4 + 2 * 20 + 2;
  EXPECT_DOUBLE_EQ(r.steps[0].modelled_us, 3 * microbatch + 50);
  EXPECT_DOUBLE_EQ(r.steps[0].compute_us, 3 * microbatch + 50);
}

TEST(PredictedJob, ZeroReduceScattersTheGradientsAndAllGathersTheParameters) {
  PredictedLayout l;
  l.tp = 2;
  l.dp = 2;
  l.zero = 1;
  l.microbatches = 2;
  l.stage_layers = {1};
  l.gradient_bytes = 4;
  l.parameter_bytes = 2;
  const auto traces = PredictedTraces(Costs(), Capture(1), l);
  ASSERT_EQ(traces.size(), 4u);
  const FabricModel f = Fabric(4);
  const auto r = runtime::ReplayTraces(traces, f);
  const double microbatch = 1 + 12 + 3 + 4 + 20 + 2;
  const double expected = 2 * microbatch +
                          Collective(f, "reducescatter", 4.0 * kParameters, {0, 2}) +
                          Collective(f, "allreduce", 4, {0, 2}) + 50 +
                          Collective(f, "allgather", 2.0 * kParameters, {0, 2});
  EXPECT_NEAR(r.steps[0].modelled_us, expected, 1e-6 * expected);
  EXPECT_GT(r.steps[0].collective_wait_us, 0);
  // Without ZeRO: one all-reduce of the gradients, no all-gather.
  l.zero = 0;
  const auto plain = runtime::ReplayTraces(PredictedTraces(Costs(), Capture(1), l), f);
  const double all_reduce = 2 * microbatch +
                            Collective(f, "allreduce", 4.0 * kParameters, {0, 2}) +
                            Collective(f, "allreduce", 4, {0, 2}) + 50;
  EXPECT_NEAR(plain.steps[0].modelled_us, all_reduce, 1e-6 * all_reduce);
}

TEST(PredictedJob, ZeroThreeGathersParametersAroundEveryMicrobatch) {
  PredictedLayout l;
  l.dp = 2;
  l.zero = 3;
  l.microbatches = 2;
  l.stage_layers = {1};
  l.gradient_bytes = 4;
  l.parameter_bytes = 2;
  const FabricModel f = Fabric(2);
  const auto r = runtime::ReplayTraces(PredictedTraces(Costs(), Capture(1), l), f);
  const double gather = Collective(f, "allgather", 2.0 * kParameters, {0, 1});
  const double scatter = Collective(f, "reducescatter", 4.0 * kParameters, {0, 1});
  const double microbatch = 1 + 12 + 3 + 4 + 20 + 2;
  // Per microbatch: gather, forward, gather, backward, reduce-scatter; then
  // the gradient norm and the optimizer, no bucketed reduction or final gather.
  const double expected = 2 * (microbatch + 2 * gather + scatter) +
                          Collective(f, "allreduce", 4, {0, 1}) + 50;
  EXPECT_NEAR(r.steps[0].modelled_us, expected, 1e-6 * expected);
  EXPECT_DOUBLE_EQ(r.steps[0].rank0_bytes.at("allgather"), 4 * 2.0 * kParameters);
  EXPECT_DOUBLE_EQ(r.steps[0].rank0_bytes.at("reducescatter"), 2 * 4.0 * kParameters);
}

TEST(PredictedJob, TwoReplicasReplayOnAnyDataParallelSize) {
  PredictedLayout l;
  l.dp = 8;
  l.microbatches = 1;
  l.stage_layers = {1};
  const auto traces = PredictedTraces(Costs(), Capture(1), l);
  EXPECT_EQ(traces.size(), 2u);  // min(dp, 2) replicas
  const auto r = runtime::ReplayTraces(traces, Fabric(8));
  EXPECT_EQ(r.dp, 8);
  EXPECT_EQ(r.world_size, 8);
}

// Expert parallelism, ep 2 of dp 4: the dense gradients are all-reduced over
// every dp rank, the experts' only over the ranks holding the same experts
// (every ep-th), one after the other on the data-parallel stream; the
// traces hold 2 replicas of ep ranks and replay on any number of replicas.
TEST(PredictedJob, ExpertGradientsAreReducedOverTheirReplicasOnly) {
  PredictedLayout l;
  l.dp = 4;
  l.ep = 2;
  l.microbatches = 1;
  l.stage_layers = {1};
  l.gradient_bytes = 4;
  proto::StepCapture capture = Capture(1);
  capture.add_stage_expert_parameters(600000);  // of the stage's 1e6
  const auto traces = PredictedTraces(Costs(), capture, l);
  ASSERT_EQ(traces.size(), 4u);
  EXPECT_EQ(traces[0].layout().tp(), 2);  // the ep x tp block of a replica
  EXPECT_EQ(traces[0].layout().ep(), 2);
  EXPECT_EQ(traces[0].layout().dp(), 2);
  const double microbatch = 1 + 12 + 3 + 4 + 20 + 2;
  for (int world : {4, 8}) {
    const FabricModel f = Fabric(world);
    std::vector<int> all, replicas;
    for (int r = 0; r < world; ++r) {
      all.push_back(r);
      if (r % 2 == 0) replicas.push_back(r);
    }
    const auto r = runtime::ReplayTraces(traces, f);
    EXPECT_EQ(r.dp, world / 2);
    EXPECT_EQ(r.ep, 2);
    const double expected = microbatch + Collective(f, "allreduce", 4 * 400000.0, all) +
                            Collective(f, "allreduce", 4 * 600000.0, replicas) +
                            Collective(f, "allreduce", 4, all) + 50;
    EXPECT_NEAR(r.steps[0].modelled_us, expected, 1e-6 * expected) << world;
    EXPECT_DOUBLE_EQ(r.steps[0].rank0_bytes.at("allreduce"), 4 * 1e6 + 4);
  }
  // The tp and pp scalings do not know an expert-parallel trace's groups.
  try {
    runtime::ScaleTensorParallel(traces, traces, 4);
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("an expert-parallel recording (ep 2)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ScalePipeline(traces, 2), InvalidUsage);
  // ep = dp: the experts have no replicas, nothing reduces them.
  l.ep = 4;
  const auto alone = runtime::ReplayTraces(PredictedTraces(Costs(), capture, l), Fabric(4));
  EXPECT_DOUBLE_EQ(alone.steps[0].rank0_bytes.at("allreduce"), 4 * 400000.0 + 4);
  l.ep = 3;
  EXPECT_THROW(PredictedTraces(Costs(), capture, l), InvalidUsage);
}

TEST(PredictedJob, OneFOneBPipelinePaysItsBubble) {
  PredictedLayout l;
  l.pp = 2;
  l.microbatches = 4;
  l.stage_layers = {1, 1};
  l.message_bytes = 0;
  const auto r = runtime::ReplayTraces(PredictedTraces(Costs(), Capture(2), l), Fabric(2));
  // Stage 0: embed + layer forward 13, backward 22; stage 1: 15 and 24.
  // The slower stage's work, plus at least one forward and backward of the other.
  const double busy = 4 * (15 + 24) + 50;
  EXPECT_GE(r.steps[0].modelled_us, busy + 13 + 22 - 1e-9);
  EXPECT_LT(r.steps[0].modelled_us, busy + 13 + 22 + 100);  // plus message latencies
  EXPECT_GT(r.steps[0].message_wait_us, 0);
}

TEST(PredictedJob, MissingPhasesAndMismatchedStagesAreNamed) {
  PredictedLayout l;
  l.stage_layers = {1};
  StepCosts costs = Costs();
  costs.erase("head_backward");
  try {
    PredictedTraces(costs, Capture(1), l);
    FAIL();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("no phase head_backward"), std::string::npos);
  }
  l.pp = 2;
  EXPECT_THROW(PredictedTraces(Costs(), Capture(1), l), InvalidUsage);
  l.pp = 1;
  l.microbatches = 0;
  EXPECT_THROW(PredictedTraces(Costs(), Capture(1), l), InvalidUsage);
}

}  // namespace
}  // namespace neuron::parallel
