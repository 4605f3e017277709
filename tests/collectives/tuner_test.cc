// Tuner: the host algorithm of each collective, from the group's shape and
// the call's size alone; what a group cannot run is refused by name.
#include "neuron/collectives/tuner.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {
namespace {

// NEURON_CC_ALGO unset while a test runs (the environment's value restored).
class TunerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* value = ::getenv("NEURON_CC_ALGO")) saved_ = value;
    ::unsetenv("NEURON_CC_ALGO");
  }
  void TearDown() override {
    if (saved_.empty()) {
      ::unsetenv("NEURON_CC_ALGO");
    } else {
      ::setenv("NEURON_CC_ALGO", saved_.c_str(), 1);
    }
  }

 private:
  std::string saved_;
};

constexpr std::size_t kSmall = 16 << 10;
constexpr GroupShape kShm{8, true, false};
constexpr GroupShape kTcp{8, false, false};
constexpr GroupShape kHosts{8, false, true};

// The InvalidUsage message of `call`, or "" when it does not throw.
template <typename F>
std::string Refusal(F call) {
  try {
    call();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "";
}

TEST_F(TunerTest, AllReduceByTransportAndSize) {
  const Tuner tuner(kSmall);
  EXPECT_EQ(tuner.AllReduce(Algorithm::kAuto, 64 << 20, 16 << 20, kShm),
            Algorithm::kDirect);
  EXPECT_EQ(tuner.AllReduce(Algorithm::kAuto, 8, 2, kHosts), Algorithm::kHierarchical);
  EXPECT_EQ(tuner.AllReduce(Algorithm::kAuto, kSmall, kSmall / 4, kTcp),
            Algorithm::kRecursiveDoubling);
  EXPECT_EQ(tuner.AllReduce(Algorithm::kAuto, kSmall + 4, kSmall / 4 + 1, kTcp),
            Algorithm::kRing);
  // Fewer elements than ranks: the ring would leave chunks empty.
  EXPECT_EQ(tuner.AllReduce(Algorithm::kAuto, 1 << 20, 7, kTcp),
            Algorithm::kRecursiveDoubling);
  // The call's own choice wins when the group can run it.
  EXPECT_EQ(tuner.AllReduce(Algorithm::kRabenseifner, 8, 2, kShm),
            Algorithm::kRabenseifner);
  EXPECT_EQ(Tuner(0).AllReduce(Algorithm::kAuto, 4, 1, kTcp),
            Algorithm::kRecursiveDoubling);
}

TEST_F(TunerTest, AllGatherByBlockSize) {
  const Tuner tuner(kSmall);
  EXPECT_EQ(tuner.AllGather(Algorithm::kAuto, 4096, kShm), Algorithm::kBruck);
  EXPECT_EQ(tuner.AllGather(Algorithm::kAuto, 4097, kShm), Algorithm::kRing);
  EXPECT_EQ(tuner.AllGather(Algorithm::kAuto, 8, kHosts), Algorithm::kHierarchical);
  EXPECT_EQ(tuner.AllGather(Algorithm::kRing, 8, kHosts), Algorithm::kRing);
}

TEST_F(TunerTest, RefusesWhatTheGroupCannotRun) {
  const Tuner tuner(kSmall);
  EXPECT_NE(Refusal([&] {
              tuner.AllReduce(Algorithm::kDirect, 8, 2, kTcp);
            }).find("allreduce: the direct algorithm needs every rank on one host"),
            std::string::npos);
  EXPECT_NE(Refusal([&] {
              tuner.AllReduce(Algorithm::kHierarchical, 8, 2, kShm);
            }).find("allreduce: the hierarchical algorithm needs ranks on several hosts"),
            std::string::npos);
  EXPECT_NE(Refusal([&] {
              tuner.AllReduce(Algorithm::kBruck, 8, 2, kShm);
            }).find("allreduce: algorithm bruck does not implement it"),
            std::string::npos);
  EXPECT_NE(Refusal([&] {
              tuner.AllGather(Algorithm::kDirect, 8, kShm);
            }).find("allgather: algorithm direct does not implement it"),
            std::string::npos);
  EXPECT_NE(Refusal([&] {
              tuner.AllGather(Algorithm::kHierarchical, 8, kShm);
            }).find("allgather: the hierarchical algorithm needs ranks on several hosts"),
            std::string::npos);
}

TEST_F(TunerTest, TheEnvironmentForcesAnAllReduceAlgorithm) {
  ::setenv("NEURON_CC_ALGO", "ring", 1);
  const Tuner forced(kSmall);
  ::setenv("NEURON_CC_ALGO", "fastest", 1);
  const std::string refused = Refusal([] { Tuner{kSmall}; });
  EXPECT_EQ(forced.AllReduce(Algorithm::kAuto, 8, 2, kShm), Algorithm::kRing);
  // The call's own choice still wins; allgather ignores the variable.
  EXPECT_EQ(forced.AllReduce(Algorithm::kDirect, 8, 2, kShm), Algorithm::kDirect);
  EXPECT_EQ(forced.AllGather(Algorithm::kAuto, 8, kShm), Algorithm::kBruck);
  EXPECT_NE(refused.find(
                "unknown collective algorithm 'fastest' (auto, ring, recursive_doubling, "
                "binomial_tree, direct, rabenseifner, bruck, hierarchical)"),
            std::string::npos);
}

}  // namespace
}  // namespace neuron::collectives
