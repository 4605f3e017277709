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
#include "../runtime/trn2_nodes.h"
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
using runtime::testing::Trn2Nodes;
using testing::RunRanks;

constexpr int kSteps = 2, kPp = 2;

struct Job {
  std::vector<runtime::proto::RankTrace> traces;
  double slowest_step_us = 0;  // the last step's, over the ranks
};

// One rank of a tp x dp x pp job (pp 2) on threads; each figure of its step
// is serial + parallel / tp.
class JobRank {
 public:
  JobRank(Store& store, int rank, int tp, int dp)
      : traced_(store, rank, tp * dp * kPp),
        t_(rank % tp),
        p_(rank / (tp * dp)),
        peer_((1 - p_) * (tp * dp) + rank % (tp * dp)),
        tp_comm_(traced_.world->Split(p_ * dp + (rank / tp) % dp, rank)),
        dp_comm_(traced_.world->Split(p_ * tp + t_, rank)),
        grads_((16 << 10) + (512 << 10) / tp, 1.0f),
        tp_(tp) {}

  // The forward (a tensor-parallel all-reduce of activations, the same
  // bytes at every tp; a broadcast from tensor position 1 where there is
  // one), activations to the next stage and gradients back on the same
  // tensor position, a data-parallel broadcast from replica 0, and the
  // gradient all-reduce (replicated and tp-sharded weights) overlapping
  // the optimizer. Returns the clock's advance.
  double Step() {
    auto& clock = *traced_.clock;
    const double begin = clock.compute().count();
    traced_.trace->Mark("step_begin");
    clock.AdvanceCompute(SimDuration(40.0 + 240.0 / tp_));
    OnGroup(tp_comm_, [&](Communicator& c) {
      c.AllReduce({activations_.data(), activations_.size(), DataType::kFloat32});
    });
    OnGroup(tp_comm_, [&](Communicator& c) {
      c.Broadcast(
          {flags_.data(), flags_.size(), DataType::kFloat32, std::min(1, tp_ - 1)});
    });
    Exchange(1, p_ == 0);
    clock.AdvanceCompute(SimDuration(20.0 + 480.0 / tp_));  // the backward
    Exchange(2, p_ == 1);
    OnGroup(dp_comm_, [&](Communicator& c) {
      c.Broadcast({flags_.data(), flags_.size(), DataType::kFloat32, 0});
    });
    auto gradients = dp_comm_.Enqueue([&](Communicator& c) {
      c.AllReduce({grads_.data(), grads_.size(), DataType::kFloat32});
    });
    clock.AdvanceCompute(SimDuration(5.0 + 30.0 / tp_));  // the optimizer
    gradients->Wait();
    traced_.trace->Mark("step_end");
    const double advance = clock.compute().count() - begin;
    OnGroup(world_, [](Communicator& c) { c.Barrier(); });
    return advance;
  }

  runtime::proto::RankTrace Trace(int rank, int dp) const {
    runtime::proto::TraceLayout layout;
    layout.set_tp(tp_);
    layout.set_pp(kPp);
    layout.set_dp(dp);
    return traced_.trace->Snapshot(rank, tp_ * dp * kPp, layout);
  }

 private:
  static void OnGroup(AsyncCommunicator& group, std::function<void(Communicator&)> f) {
    group.Enqueue(std::move(f))->Wait();
  }

  // A message to or from the other stage, waited for.
  void Exchange(int tag, bool send) {
    world_
        .Enqueue(
            [&](Communicator& c) {
              if (send)
                c.Send(peer_, message_.data(), message_.size(), tag);
              else
                c.Recv(peer_, message_.data(), message_.size(), tag);
            },
            send ? "send" : "recv", AsyncCommunicator::Lane::kPointToPoint)
        ->Wait();
  }

  testing::TracedRank traced_;
  int t_, p_, peer_;
  AsyncCommunicator tp_comm_, dp_comm_;
  AsyncCommunicator world_{std::move(traced_.world)};
  std::vector<float> activations_ = std::vector<float>(8 << 10, 1.0f),
                     flags_ = std::vector<float>(16, 1.0f), grads_;
  std::vector<char> message_ = std::vector<char>(32 << 10);
  int tp_;
};

Job RunJob(int tp, int dp = 2) {
  const int world = tp * dp * kPp;
  Job job;
  job.traces.resize(world);
  std::vector<double> step_us(world);
  RunRanks(world, [&](int rank, Store& store) {
    JobRank r(store, rank, tp, dp);
    for (int step = 0; step < kSteps; ++step) step_us[rank] = r.Step();
    job.traces[rank] = r.Trace(rank, dp);
  });
  job.slowest_step_us = *std::max_element(step_us.begin(), step_us.end());
  return job;
}


double Compute(const runtime::proto::RankTrace& t, int n) {  // the n-th compute charge
  for (const auto& op : t.ops()) {
    if (op.has_compute() && n-- == 0) return op.compute().us();
  }
  return -1;
}

// Traces scaled from `a` and `b` to tp 4 replay to the real tp 4 run.
void ExpectScaledToTp4(const Job& a, const Job& b, const Job& tp4) {
  const auto scaled = runtime::ScaleTensorParallel(a.traces, b.traces, 4);
  ASSERT_EQ(scaled.size(), tp4.traces.size());
  for (std::size_t r = 0; r < scaled.size(); ++r) {
    EXPECT_EQ(scaled[r].layout().tp(), 4);
    EXPECT_EQ(scaled[r].ops_size(), tp4.traces[r].ops_size()) << r;
    EXPECT_NEAR(Compute(scaled[r], 1), 20.0 + 480.0 / 4, 1e-9) << r;
    // The tensor-parallel broadcast's root: tensor position 1, as recorded
    // at tp 2 (a tp 1 recording has none).
    for (const auto& op : scaled[r].ops()) {
      for (const auto& c : op.issue().collectives()) {
        if (c.kind() == "broadcast" && c.group_size() == 4) {
          EXPECT_EQ(c.group(c.root()) % 4, 1) << r;
        }
      }
    }
  }
  const auto replayed = runtime::ReplayTraces(scaled, Trn2Nodes(16));
  EXPECT_EQ(replayed.tp, 4);
  EXPECT_EQ(replayed.dp, 2);
  const double real = tp4.slowest_step_us;
  EXPECT_NEAR(replayed.steps.back().modelled_us, real, 1e-6 * real);
  EXPECT_NEAR(replayed.steps.back().rank0_bytes.at("allreduce"),
              4.0 * ((8 << 10) + (16 << 10) + (512 << 10) / 4), 1e-3);
}

TEST(TraceScaling, TwoRecordingsScaledToAThirdTpReplayToItsRealRun) {
  const Job tp1 = RunJob(1), tp2 = RunJob(2), tp4 = RunJob(4), tp8 = RunJob(8);
  {
    SCOPED_TRACE("tp 1 and tp 2, either order");
    ExpectScaledToTp4(tp1, tp2, tp4);
    ExpectScaledToTp4(tp2, tp1, tp4);
  }
  {
    SCOPED_TRACE("tp 2 and tp 8: between them, tp 8's groups narrowed");
    ExpectScaledToTp4(tp8, tp2, tp4);
  }
  {
    SCOPED_TRACE("one replica at tp 2: the tp 1 recording's replicas are kept");
    ExpectScaledToTp4(RunJob(2, 1), tp1, tp4);
  }
  // Further than recorded: tp=8, 32 ranks, then 4 replicas of it on 64.
  const auto scaled8 = runtime::ScaleTensorParallel(tp2.traces, tp4.traces, 8);
  const auto wide = runtime::ReplayTraces(scaled8, Trn2Nodes(64, 4));
  EXPECT_EQ(wide.tp, 8);
  EXPECT_EQ(wide.dp, 4);
  EXPECT_NEAR(wide.steps.back().compute_us, 40 + 30 + 20 + 60 + 5 + 30.0 / 8, 1e-6);
  EXPECT_NEAR(runtime::ReplayTraces(scaled8, Trn2Nodes(32, 2)).steps.back().modelled_us,
              tp8.slowest_step_us, 1e-6 * tp8.slowest_step_us);
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
  auto other_pp = tp1.traces;  // its 4 ranks claimed as 4 stages of one replica
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
  // Either order: the other recording's messages are checked too.
  const std::string swapped =
      ErrorOf([&] { runtime::ScaleTensorParallel(tp1.traces, crossing, 4); });
  EXPECT_NE(swapped.find("the recording at tp=2: op "), std::string::npos) << swapped;
  EXPECT_NE(swapped.find("a message between tensor positions (ranks 0 and 5)"),
            std::string::npos)
      << swapped;
  EXPECT_NE(message.find("the recording at tp=2: op "), std::string::npos) << message;
  EXPECT_NE(message.find("a message between tensor positions (ranks 0 and 5)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace neuron::collectives
