// The two clocks through the communicator (docs/architecture.md): arrival
// times travel in the headers, a collective starts at the latest arrival and
// lasts what the fabric model says, and waiting joins the compute stream.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "neuron/collectives/async_communicator.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/sim_clock.h"
#include "rank_threads.h"

namespace neuron::collectives {
namespace {

using runtime::SimDuration;
using testing::RunRanks;

std::shared_ptr<Store> Borrow(Store& store) { return {&store, [](Store*) {}}; }

// The fabric model's time for an allreduce, and the algorithm it chose.
std::pair<double, const char*> ModelledAllReduce(int size, double bytes) {
  const auto topology = runtime::Topology::Default();
  const runtime::FabricModel model(topology,
                                   runtime::PlaceRanks(topology, {static_cast<std::uint32_t>(size)}));
  const runtime::CollectiveShape shape{runtime::CollectiveKind::kAllReduce, bytes,
                                       runtime::AllRanks(size), 0};
  const auto algorithm = runtime::ChooseAlgorithm(model, shape);
  return {model.Simulate(runtime::BuildSchedule(model, shape, algorithm)).total.count(),
          runtime::Name(algorithm)};
}

class SimTime : public ::testing::TestWithParam<TransportKind> {};

INSTANTIATE_TEST_SUITE_P(Transports, SimTime,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return info.param == TransportKind::kShm ? "shm" : "tcp";
                         });

TEST_P(SimTime, CollectiveStartsAtTheLatestArrivalAndLastsTheModel) {
  constexpr int kSize = 4;
  constexpr std::size_t kCount = 1 << 18;  // 1 MiB of float32
  const auto model = ModelledAllReduce(kSize, kCount * 4.0);
  const double modelled = model.first;
  const std::string algorithm = model.second;
  std::vector<double> ends(kSize);
  RunRanks(kSize, [&](int rank, Store& store) {
    CommunicatorOptions options;
    options.transport = GetParam();
    Communicator comm(Borrow(store), rank, kSize, options);
    comm.clock().AdvanceCompute(SimDuration(100.0 * rank));  // rank 3 is 300 us late
    std::vector<float> data(kCount, 1.0f);
    comm.AllReduce({data.data(), kCount, DataType::kFloat32});
    ASSERT_EQ(comm.records().size(), 1u);
    const OpRecord& r = comm.records()[0];
    EXPECT_DOUBLE_EQ(r.arrival_us, 100.0 * rank);
    EXPECT_DOUBLE_EQ(r.start_us, 300.0);
    EXPECT_NEAR(r.modelled_us, modelled, 1e-9);
    EXPECT_DOUBLE_EQ(r.end_us, 300.0 + modelled);
    EXPECT_EQ(r.fabric_algorithm, algorithm);
    EXPECT_DOUBLE_EQ(comm.totals().waited_us, 300.0 - 100.0 * rank);
    // A synchronous call: the compute stream waited for it.
    EXPECT_DOUBLE_EQ(comm.clock().compute().count(), 300.0 + modelled);
    EXPECT_DOUBLE_EQ(comm.clock().collective().count(), 300.0 + modelled);
    ends[rank] = r.end_us;
  });
  for (double end : ends) EXPECT_DOUBLE_EQ(end, ends[0]);
}

TEST(SimTimeAsync, OverlapShowsUntilTheWorkIsWaitedOn) {
  constexpr int kSize = 2;
  RunRanks(kSize, [&](int rank, Store& store) {
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, kSize));
    std::vector<float> data(1 << 20, 1.0f);
    runtime::SimClock* clock = nullptr;
    auto work = async.Enqueue([&](Communicator& c) {
      clock = &c.clock();
      c.AllReduce({data.data(), data.size(), DataType::kFloat32});
    });
    while (!work->Test()) std::this_thread::yield();
    // Compute has not moved yet: the allreduce overlaps whatever runs next.
    EXPECT_DOUBLE_EQ(clock->compute().count(), 0.0);
    clock->AdvanceCompute(SimDuration(1.0));  // less than the allreduce takes
    work->Wait();
    EXPECT_DOUBLE_EQ(clock->compute().count(), clock->collective().count());
    EXPECT_GT(clock->compute().count(), 1.0);
  });
}

TEST(SimTimeTrace, ChromeTraceHasBothClocks) {
  char tmpl[] = "/tmp/neuron_trace_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  RunRanks(2, [&](int rank, Store& store) {
    Communicator comm(Borrow(store), rank, 2);
    std::vector<float> data(1000, 1.0f);
    comm.AllReduce({data.data(), data.size(), DataType::kFloat32});
    comm.Barrier();
    EXPECT_EQ(comm.totals().operations, 2u);
    if (rank == 0) comm.WriteChromeTrace(dir + "/trace.json");
  });
  std::ifstream in(dir + "/trace.json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.str().find("\"name\": \"allreduce #0\""), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"pid\": \"simulated\""), std::string::npos);
  EXPECT_NE(text.str().find("\"name\": \"barrier #1\""), std::string::npos);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace neuron::collectives

namespace neuron::collectives {
namespace {

// NEURON_FABRIC_ALGO steers the modelled algorithm (not the host's): the
// records name it and carry its time.
TEST(SimTimeFabricAlgorithm, TheForcedModelledAlgorithmIsRecorded) {
  const auto topology = runtime::Topology::Default();
  const runtime::FabricModel model(topology, runtime::PlaceRanks(topology, {4}));
  constexpr std::size_t kCount = 1 << 20;  // 4 MiB
  // recursive_doubling: never the automatic choice (not a candidate).
  const double forced = runtime::ModelCollective(model, "allreduce", kCount * 4.0,
                                                 runtime::AllRanks(4), 0,
                                                 runtime::FabricAlgorithm::kRecursiveDoubling)
                            .micros;
  ::setenv("NEURON_FABRIC_ALGO", "recursive_doubling", 1);
  RunRanks(4, [&](int rank, Store& store) {
    Communicator comm(Borrow(store), rank, 4, CommunicatorOptions{});
    std::vector<float> data(kCount, 1.0f);
    comm.AllReduce({data.data(), kCount, DataType::kFloat32});
    const OpRecord& r = comm.records().back();
    EXPECT_EQ(r.fabric_algorithm, "recursive_doubling");
    EXPECT_DOUBLE_EQ(r.modelled_us, forced);
    EXPECT_EQ(data[0], 4.0f);
  });
  ::unsetenv("NEURON_FABRIC_ALGO");
}

TEST(SimTimeFaults, ADelayedRankHoldsEveryoneUp) {
  ::setenv("NEURON_FAULTS", "rank_delays { rank: 2 delay_us: 500 }", 1);
  const auto topology = runtime::Topology::FromEnvironment();
  ::unsetenv("NEURON_FAULTS");
  EXPECT_DOUBLE_EQ(topology.RankDelay(2).count(), 500);
  auto fabric = std::make_shared<runtime::FabricModel>(topology, runtime::PlaceRanks(topology, {4}));
  RunRanks(4, [&](int rank, Store& store) {
    CommunicatorOptions options;
    options.fabric = fabric;
    Communicator comm(Borrow(store), rank, 4, options);
    comm.Barrier();
    const OpRecord& r = comm.records().back();
    EXPECT_DOUBLE_EQ(r.start_us, 500.0);
    EXPECT_DOUBLE_EQ(comm.totals().waited_us, rank == 2 ? 0.0 : 500.0);
  });
}

// A fault that leaves two ranks' chips without a route: the operation's
// accounting raises the model's error in the caller (an exception leaving a
// destructor or a thread would end the process instead).
TEST(SimTimeFaults, AFabricWithoutARouteFailsTheOperationNotTheProcess) {
  const auto topology = runtime::Topology::FromText(
      "chips_per_node: 2 torus_dims: [2] ranks_per_chip: 1 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "inter_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "faults { from_chip: 0 to_chip: 1 down: true } faults { from_chip: 1 to_chip: 0 down: true }",
      "cut-pair");
  auto fabric = std::make_shared<runtime::FabricModel>(topology, runtime::PlaceRanks(topology, {2}));
  RunRanks(2, [&](int rank, Store& store) {
    CommunicatorOptions options;
    options.fabric = fabric;
    Communicator comm(Borrow(store), rank, 2, options);
    std::vector<float> data(16, 1.0f);
    try {
      comm.AllReduce({data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum});
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("no route from chip"), std::string::npos) << e.what();
    }
    EXPECT_EQ(data[0], 2.0f);  // the data moved; only the model has no route
  });
}

TEST(SimTimeFaults, EnvironmentFaultsAreCheckedLikeTheFile) {
  ::setenv("NEURON_FAULTS", "chips_per_node: 3", 1);
  EXPECT_THROW(runtime::Topology::FromEnvironment(), InvalidUsage);
  ::setenv("NEURON_FAULTS", "faults { from_chip: 0 to_chip: 1 slowdown: 0.5 }", 1);
  EXPECT_THROW(runtime::Topology::FromEnvironment(), InvalidUsage);
  ::setenv("NEURON_FAULTS", "faults { from_chip: 0 to_chip: 1 slowdown: 4 }", 1);
  EXPECT_EQ(runtime::Topology::FromEnvironment().spec().faults_size(), 1);
  ::unsetenv("NEURON_FAULTS");
}

}  // namespace
}  // namespace neuron::collectives
