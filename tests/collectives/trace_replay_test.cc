// Recording a job's operation traces and replaying them through the fabric
// model (runtime/fabric/trace_replay.h): the replay of a real run gives the
// real run's modelled step times, and the replay of a smaller run on more
// data-parallel replicas gives what the larger run really models.
#include "neuron/runtime/fabric/trace_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"
#include "rank_threads.h"
#include "traced_rank.h"

namespace neuron::collectives {
namespace {

using runtime::SimDuration;
using testing::RunRanks;

constexpr int kSteps = 3;

struct Job {
  std::vector<runtime::proto::RankTrace> traces;
  std::vector<std::vector<double>> step_us;  // [rank][step]: the clock's advance
};

// A tp x dp training step on threads: tensor-parallel all-reduce (waited at
// once), a data-parallel gradient all-reduce overlapped with more compute,
// a message between the tensor-parallel pair, a barrier on the world.
// Compute depends on the tensor-parallel rank only, so every data-parallel
// replica does the same work (what replay assumes). With `save_dir`, each
// rank also saves its trace there (OpTrace::Save, rank_N.pb).
Job RunJob(int world, int tp, const std::string& save_dir = "") {
  Job job;
  job.traces.resize(world);
  job.step_us.assign(world, std::vector<double>(kSteps));
  RunRanks(world, [&](int rank, Store& store) {
    testing::TracedRank traced(store, rank, world);
    const auto& clock = traced.clock;
    const auto& trace = traced.trace;
    auto& world_comm = traced.world;
    const int t = rank % tp, d = rank / tp;
    AsyncCommunicator tp_comm(world_comm->Split(d, rank));
    AsyncCommunicator dp_comm(world_comm->Split(t, rank));
    AsyncCommunicator world_async(std::move(world_comm));
    std::vector<float> activations(16 << 10, 1.0f), grads(4 << 20, 1.0f);
    std::vector<char> message(64 << 10);
    for (int step = 0; step < kSteps; ++step) {
      const double begin = clock->compute().count();
      trace->Mark("step_begin");
      clock->AdvanceCompute(SimDuration(50.0 + 15.0 * t));
      tp_comm.Enqueue([&](Communicator& c) {
        c.AllReduce({activations.data(), activations.size(), DataType::kFloat32});
      })->Wait();
      clock->AdvanceCompute(SimDuration(30.0));
      auto gradients = dp_comm.Enqueue([&](Communicator& c) {
        c.AllReduce({grads.data(), grads.size(), DataType::kFloat32});
      });
      clock->AdvanceCompute(SimDuration(40.0 + 5.0 * t));  // overlaps the all-reduce
      if (tp > 1) {
        const int peer = d * tp + (t + 1) % tp, from = d * tp + (t + tp - 1) % tp;
        auto sent = world_async.Enqueue(
            [&](Communicator& c) { c.Send(peer, message.data(), message.size(), 7); }, "send",
            AsyncCommunicator::Lane::kPointToPoint);
        world_async.Enqueue(
            [&](Communicator& c) { c.Recv(from, message.data(), message.size(), 7); }, "recv",
            AsyncCommunicator::Lane::kPointToPoint)->Wait();
        sent->Wait();
      }
      gradients->Wait();
      clock->AdvanceCompute(SimDuration(10.0));  // the optimizer
      trace->Mark("step_end");
      job.step_us[rank][step] = clock->compute().count() - begin;
      world_async.Enqueue([](Communicator& c) { c.Barrier(); })->Wait();
    }
    runtime::proto::TraceLayout layout;
    layout.set_tp(tp);
    layout.set_pp(1);
    layout.set_dp(world / tp);
    job.traces[rank] = trace->Snapshot(rank, world, layout);
    if (!save_dir.empty()) {
      trace->Save(save_dir + "/rank_" + std::to_string(rank) + ".pb", rank, world, layout);
    }
  });
  return job;
}

double SlowestStep(const Job& job, int step) {
  double slowest = 0;
  for (const auto& rank : job.step_us) slowest = std::max(slowest, rank[step]);
  return slowest;
}

runtime::FabricModel OneNode(int world) {
  const auto topology = runtime::Topology::Default();
  return runtime::FabricModel(topology,
                              runtime::PlaceRanks(topology, {static_cast<std::uint32_t>(world)}));
}

TEST(TraceReplay, ReplayOfARealRunGivesItsModelledSteps) {
  const std::string dir = ::testing::TempDir() + "/trace_replay_saved";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Job job = RunJob(4, 2, dir);
  const auto result = runtime::ReplayTraces(job.traces, OneNode(4));
  ASSERT_EQ(result.steps.size(), static_cast<std::size_t>(kSteps));
  EXPECT_EQ(result.world_size, 4);
  EXPECT_EQ(result.dp, 2);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(result.steps[step].modelled_us, SlowestStep(job, step), 1e-6) << step;
    EXPECT_GT(result.steps[step].collective_wait_us, 0) << step;
    // The slowest rank's compute: a tensor-parallel rank 0 or 1.
    EXPECT_TRUE(result.steps[step].compute_us == 50 + 30 + 40 + 10 ||
                result.steps[step].compute_us == 50 + 15 + 30 + 40 + 5 + 10)
        << result.steps[step].compute_us;
    EXPECT_DOUBLE_EQ(result.steps[step].rank0_bytes.at("allreduce"),
                     (16 << 10) * 4.0 + (4 << 20) * 4.0);
  }
  // Saved (OpTrace::Save) and loaded: the snapshots, field for field.
  const auto loaded = runtime::LoadJobTraces(dir);
  ASSERT_EQ(loaded.size(), job.traces.size());
  for (std::size_t r = 0; r < loaded.size(); ++r) {
    EXPECT_EQ(loaded[r].rank(), static_cast<int>(r));
    EXPECT_EQ(loaded[r].layout().tp(), 2);
    EXPECT_EQ(loaded[r].SerializeAsString(), job.traces[r].SerializeAsString()) << r;
  }
  EXPECT_NEAR(runtime::ReplayTraces(loaded, OneNode(4)).steps[1].modelled_us,
              result.steps[1].modelled_us, 1e-9);
  std::filesystem::remove_all(dir);
}

TEST(TraceReplay, ATraceDirectoryThatIsNoneIsNamedForWhatItIs) {
  namespace fs = std::filesystem;
  const fs::path base = fs::path(::testing::TempDir()) / "trace_paths";
  fs::remove_all(base);
  fs::create_directories(base);
  fs::create_symlink("/dev/zero", base / "zero");
  std::ofstream(base / "file") << "x";
  auto error = [](const fs::path& p) {
    try {
      runtime::LoadJobTraces(p.string());
    } catch (const InvalidUsage& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(base / "zero").find("zero is not a directory (a character device, through a "
                                      "symbolic link)"), std::string::npos) << error(base / "zero");
  EXPECT_NE(error(base / "file").find("file is not a directory (a regular file)"),
            std::string::npos);
  EXPECT_NE(error(base / "none").find("none does not exist"), std::string::npos);
  EXPECT_NE(error(base).find("no rank_N.pb traces in"), std::string::npos);
  fs::remove_all(base);
}

TEST(TraceReplay, SmallerRunScaledUpEqualsTheLargerRealRun) {
  const Job small = RunJob(4, 2);   // tp 2 x dp 2
  const Job large = RunJob(12, 2);  // tp 2 x dp 6, really run
  const auto replayed = runtime::ReplayTraces(small.traces, OneNode(12));
  EXPECT_EQ(replayed.dp, 6);
  EXPECT_EQ(replayed.recorded_world_size, 4);
  for (int step = 0; step < kSteps; ++step) {
    const double real = SlowestStep(large, step);
    EXPECT_NEAR(replayed.steps[step].modelled_us, real, 0.02 * real) << step;
    // The data-parallel all-reduce grew: the larger job's step is longer.
    EXPECT_GT(real, SlowestStep(small, step));
  }
}

TEST(TraceReplay, ScalingRefusesWhatItCannotMap) {
  const Job one_replica = RunJob(2, 2);  // tp 2 x dp 1
  try {
    runtime::ReplayTraces(one_replica.traces, OneNode(4));
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("needs a trace of at least 2 replicas"),
              std::string::npos)
        << e.what();
  }
  const Job job = RunJob(4, 2);
  try {
    runtime::ReplayTraces(job.traces, OneNode(5));
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("tp x pp must divide them"), std::string::npos)
        << e.what();
  }
  auto missing = job.traces;
  missing.pop_back();
  try {
    runtime::ReplayTraces(missing, OneNode(4));
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("the traces are of 3 ranks"), std::string::npos)
        << e.what();
  }
}

TEST(TraceReplay, TracesThatNeverMatchAreADeadlockNamingTheRanks) {
  Job job = RunJob(4, 2);
  // Rank 3 "forgets" its first issue: its peers wait for it for ever.
  auto* ops = job.traces[3].mutable_ops();
  for (int i = 0; i < ops->size(); ++i) {
    if (!ops->Get(i).has_issue()) continue;
    ops->Mutable(i)->mutable_issue()->clear_collectives();
    break;
  }
  try {
    runtime::ReplayTraces(job.traces, OneNode(4));
    FAIL() << "expected InvalidUsage";
  } catch (const InvalidUsage& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the traces deadlock in replay: rank "), std::string::npos) << what;
    EXPECT_NE(what.find(" waits for "), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace neuron::collectives
