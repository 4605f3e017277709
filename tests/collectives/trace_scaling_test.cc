// Scaling a job's traces to another tensor-parallel size from two
// recordings (runtime/fabric/trace_scaling.h): a job whose per-rank work
// follows Amdahl's law, recorded at two tp sizes and scaled to a third,
// replays to what the third really models; what cannot be scaled is
// refused with the rank and op.
#include "neuron/runtime/fabric/trace_scaling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../runtime/error_of.h"
#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"
#include "rank_threads.h"
#include "traced_rank.h"

namespace neuron::collectives {
namespace {

using runtime::SimDuration;
using runtime::testing::ErrorOf;
using testing::RunRanks;

constexpr int kSteps = 2, kDp = 2, kPp = 2;

struct Job {
  std::vector<runtime::proto::RankTrace> traces;
  double slowest_step_us = 0;  // the last step's, over the ranks
};

// A tp x dp x pp step on threads, each figure serial + parallel / tp: the
// forward (a tensor-parallel all-reduce of activations, the same bytes at
// every tp), activations sent to the next stage and gradients back on the
// same tensor position, a data-parallel gradient all-reduce (replicated
// and tp-sharded weights) overlapping the optimizer.
Job RunJob(int tp) {
  const int world = tp * kDp * kPp;
  Job job;
  job.traces.resize(world);
  std::vector<double> step_us(world);
  RunRanks(world, [&](int rank, Store& store) {
    testing::TracedRank traced(store, rank, world);
    const auto& clock = traced.clock;
    const auto& trace = traced.trace;
    auto& world_comm = traced.world;
    const int t = rank % tp, d = (rank / tp) % kDp, p = rank / (tp * kDp);
    AsyncCommunicator tp_comm(world_comm->Split(p * kDp + d, rank));
    AsyncCommunicator dp_comm(world_comm->Split(p * tp + t, rank));
    AsyncCommunicator world_async(std::move(world_comm));
    std::vector<float> activations(8 << 10, 1.0f),
        grads((16 << 10) + (512 << 10) / tp, 1.0f);
    std::vector<char> message(32 << 10);
    const int peer = (1 - p) * (tp * kDp) + d * tp + t;
    for (int step = 0; step < kSteps; ++step) {
      const double begin = clock->compute().count();
      trace->Mark("step_begin");
      clock->AdvanceCompute(SimDuration(40.0 + 240.0 / tp));
      tp_comm
          .Enqueue([&](Communicator& c) {
            c.AllReduce({activations.data(), activations.size(), DataType::kFloat32});
          })
          ->Wait();
      const bool first = p == 0;
      world_async
          .Enqueue(
              [&](Communicator& c) {
                if (first)
                  c.Send(peer, message.data(), message.size(), 1);
                else
                  c.Recv(peer, message.data(), message.size(), 1);
              },
              first ? "send" : "recv", AsyncCommunicator::Lane::kPointToPoint)
          ->Wait();
      clock->AdvanceCompute(SimDuration(20.0 + 480.0 / tp));  // the backward
      world_async
          .Enqueue(
              [&](Communicator& c) {
                if (first)
                  c.Recv(peer, message.data(), message.size(), 2);
                else
                  c.Send(peer, message.data(), message.size(), 2);
              },
              first ? "recv" : "send", AsyncCommunicator::Lane::kPointToPoint)
          ->Wait();
      auto gradients = dp_comm.Enqueue([&](Communicator& c) {
        c.AllReduce({grads.data(), grads.size(), DataType::kFloat32});
      });
      clock->AdvanceCompute(SimDuration(5.0 + 30.0 / tp));  // the optimizer
      gradients->Wait();
      trace->Mark("step_end");
      step_us[rank] = clock->compute().count() - begin;
      world_async.Enqueue([](Communicator& c) { c.Barrier(); })->Wait();
    }
    runtime::proto::TraceLayout layout;
    layout.set_tp(tp);
    layout.set_pp(kPp);
    layout.set_dp(kDp);
    job.traces[rank] = trace->Snapshot(rank, world, layout);
  });
  job.slowest_step_us = *std::max_element(step_us.begin(), step_us.end());
  return job;
}

// `nodes` trn2 nodes of 16 ranks (or one of `world`).
runtime::FabricModel Nodes(int world, int nodes = 1) {
  const auto topology = runtime::Topology::Default();
  return runtime::FabricModel(
      topology, runtime::PlaceRanks(
                    topology, std::vector<std::uint32_t>(
                                  nodes, static_cast<std::uint32_t>(world / nodes))));
}

double Compute(const runtime::proto::RankTrace& t, int n) {  // the n-th compute charge
  for (const auto& op : t.ops()) {
    if (op.has_compute() && n-- == 0) return op.compute().us();
  }
  return -1;
}

TEST(TraceScaling, TwoRecordingsScaledToAThirdTpReplayToItsRealRun) {
  const Job tp1 = RunJob(1), tp2 = RunJob(2), tp4 = RunJob(4);
  for (const auto& [a, b] : {std::pair{&tp1, &tp2}, std::pair{&tp2, &tp1}}) {
    const auto scaled = runtime::ScaleTensorParallel(a->traces, b->traces, 4);
    ASSERT_EQ(scaled.size(), tp4.traces.size());
    for (std::size_t r = 0; r < scaled.size(); ++r) {
      EXPECT_EQ(scaled[r].layout().tp(), 4);
      EXPECT_EQ(scaled[r].ops_size(), tp4.traces[r].ops_size()) << r;
      EXPECT_NEAR(Compute(scaled[r], 1), 20.0 + 480.0 / 4, 1e-9) << r;
    }
    const auto replayed = runtime::ReplayTraces(scaled, Nodes(16));
    EXPECT_EQ(replayed.tp, 4);
    EXPECT_EQ(replayed.dp, kDp);
    const double real = tp4.slowest_step_us;
    EXPECT_NEAR(replayed.steps.back().modelled_us, real, 1e-6 * real);
    EXPECT_NEAR(replayed.steps.back().rank0_bytes.at("allreduce"),
                4.0 * ((8 << 10) + (16 << 10) + (512 << 10) / 4), 1e-3);
  }
  // Further than recorded: tp=8, 32 ranks, then 4 replicas of it on 64.
  const auto tp8 = runtime::ScaleTensorParallel(tp2.traces, tp4.traces, 8);
  const auto wide = runtime::ReplayTraces(tp8, Nodes(64, 4));
  EXPECT_EQ(wide.tp, 8);
  EXPECT_EQ(wide.dp, 4);
  EXPECT_NEAR(wide.steps.back().compute_us, 40 + 30 + 20 + 60 + 5 + 30.0 / 8, 1e-6);
}

TEST(TraceScaling, RefusesWhatItCannotScale) {
  const Job tp1 = RunJob(1), tp2 = RunJob(2), tp4 = RunJob(4);
  EXPECT_NE(ErrorOf([&] {
              runtime::ScaleTensorParallel(tp4.traces, tp2.traces, 1);
            }).find("cannot scale to tp=1, below both recordings (tp=4 and tp=2)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              runtime::ScaleTensorParallel(tp2.traces, tp2.traces, 4);
            }).find("two different tp sizes"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              runtime::ScaleTensorParallel(tp1.traces, tp2.traces, 0);
            }).find("cannot scale to tp=0"),
            std::string::npos);
  auto other_pp =
      tp1.traces;  // the same ranks claimed as 2 stages x 2 replicas of tp 1 ... pp 4
  for (auto& t : other_pp) {
    t.mutable_layout()->set_pp(4);
    t.mutable_layout()->set_dp(1);
  }
  EXPECT_NE(ErrorOf([&] {
              runtime::ScaleTensorParallel(other_pp, tp2.traces, 4);
            }).find("differ in pp (4 and 2)"),
            std::string::npos);
  auto fewer = tp2.traces;  // rank 5 lost its first compute charge
  for (int i = 0; i < fewer[5].ops_size(); ++i) {
    if (!fewer[5].ops(i).has_compute()) continue;
    fewer[5].mutable_ops()->DeleteSubrange(i, 1);
    break;
  }
  const std::string differ =
      ErrorOf([&] { runtime::ScaleTensorParallel(tp1.traces, fewer, 4); });
  EXPECT_NE(differ.find("run different programs"), std::string::npos) << differ;
  EXPECT_NE(differ.find("ranks 2 and 5"), std::string::npos) << differ;
  auto crossing = tp2.traces;  // rank 0's first message goes to another tensor position
  for (auto& op : *crossing[0].mutable_ops()) {
    if (!op.has_issue() || op.issue().messages_size() == 0) continue;
    op.mutable_issue()->mutable_messages(0)->set_peer(5);
    break;
  }
  const std::string message =
      ErrorOf([&] { runtime::ScaleTensorParallel(crossing, tp1.traces, 4); });
  EXPECT_NE(message.find("a message between tensor positions (recorded ranks 0 and 5)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace neuron::collectives
