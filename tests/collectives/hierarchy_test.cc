// The hierarchy's levels (collectives/src/hierarchy.h) and how a failure in
// one reaches the ranks waiting in the other.
#include "hierarchy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "neuron/runtime/error.h"
#include "rank_threads.h"

namespace neuron::collectives::detail {
namespace {

using namespace std::chrono_literals;
using testing::RunRanks;

// Hosts {a, a, b, b}; rank 3 aborts its levels instead of joining. Rank 2
// fails in host b's level and aborts the leaders' level, where rank 0 fails
// and aborts host a's level, where rank 1 fails: each names the cause, at
// once, not at the 60 s timeout (rank 3 stays alive, its connections open).
TEST(Hierarchy, AFailureInOneLevelFailsTheRanksWaitingInTheOther) {
  std::atomic<int> finished{0};
  RunRanks(4, [&](int rank, Store& store) {
    CommunicatorOptions options;
    options.tcp_address = "127.0.0.1";
    options.timeout = 60s;
    Communicator parent(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 4, options);
    auto hierarchy = Hierarchy::Build(parent, {"a", "a", "b", "b"}, options);
    ASSERT_NE(hierarchy, nullptr);
    if (rank == 3) {
      hierarchy->Abort("rank 3 gave up");
      for (int i = 0; i < 3000 && finished.load() < 3; ++i)
        std::this_thread::sleep_for(10ms);
      return;
    }
    std::vector<float> data(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      hierarchy->AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
      ADD_FAILURE() << "rank " << rank << " finished an allreduce rank 3 never joined";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("rank 3 gave up"), std::string::npos)
          << "rank " << rank << ": " << e.what();
      if (rank != 2) {
        EXPECT_NE(std::string(e.what()).find("failed in a hierarchical collective"),
                  std::string::npos)
            << "rank " << rank << ": " << e.what();
      }
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "rank " << rank;
    ++finished;
  });
}

}  // namespace
}  // namespace neuron::collectives::detail
