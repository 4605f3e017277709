// All-to-all with every mix of equal, uneven and zero blocks across ranks
// (each rank passes its own form: a count, or per-peer sizes), against a
// reference of what each rank receives from each peer; and the mismatches
// the call check and the per-peer size check must still name.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"
#include "dtype_values.h"
#include "rank_threads.h"

namespace neuron::collectives {
namespace {

using testing::RunRanks;

// How the ranks' blocks are sized (what rank a sends rank b, Elements()).
enum class Mix {
  kAllEqual,            // 3 elements between every pair
  kAllUneven,           // 1-4 elements, depending on the pair
  kLastEqual,           // the last rank sends and receives 3 everywhere; others uneven
  kLastSendsNothing,    // the last rank's input is empty; it still receives
  kLastReceivesNothing, // nobody sends to the last rank; it still sends
  kLastIdle,            // the last rank neither sends nor receives (all-zero splits)
  kAllZero,
};
constexpr Mix kMixes[] = {Mix::kAllEqual,         Mix::kAllUneven,
                          Mix::kLastEqual,        Mix::kLastSendsNothing,
                          Mix::kLastReceivesNothing, Mix::kLastIdle,
                          Mix::kAllZero};

const char* Name(Mix mix) {
  switch (mix) {
    case Mix::kAllEqual: return "all equal";
    case Mix::kAllUneven: return "all uneven";
    case Mix::kLastEqual: return "last rank equal, others uneven";
    case Mix::kLastSendsNothing: return "last rank sends nothing";
    case Mix::kLastReceivesNothing: return "last rank receives nothing";
    case Mix::kLastIdle: return "last rank all zero";
    case Mix::kAllZero: return "all zero";
  }
  return "?";
}

std::size_t Elements(Mix mix, int size, int a, int b) {
  const std::size_t uneven = static_cast<std::size_t>((a + 2 * b + 1) % 4 + 1);
  const int last = size - 1;
  switch (mix) {
    case Mix::kAllEqual: return 3;
    case Mix::kAllUneven: return uneven;
    case Mix::kLastEqual: return a == last || b == last ? 3 : uneven;
    case Mix::kLastSendsNothing: return a == last ? 0 : uneven;
    case Mix::kLastReceivesNothing: return b == last ? 0 : uneven;
    case Mix::kLastIdle: return a == last || b == last ? 0 : uneven;
    case Mix::kAllZero: return 0;
  }
  return 0;
}

// Element i of what rank a sends rank b: exact in every dtype used here.
double Value(int a, int b, std::size_t i) {
  return static_cast<double>(a * 64 + b * 8 + static_cast<int>(i % 8));
}

// Runs one all-to-all of `mix` on this rank and checks every received block.
// `count_form`: a rank whose blocks are all equal passes them as a count
// (as all_to_all_single without split sizes), else as per-peer sizes.
void CheckMix(Communicator& comm, Mix mix, DataType type, bool count_form) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<std::size_t> sends(size), recvs(size);
  std::vector<double> in, want;
  for (int p = 0; p < size; ++p) {
    sends[p] = Elements(mix, size, rank, p);
    recvs[p] = Elements(mix, size, p, rank);
    for (std::size_t i = 0; i < sends[p]; ++i) in.push_back(Value(rank, p, i));
    for (std::size_t i = 0; i < recvs[p]; ++i) want.push_back(Value(p, rank, i));
  }
  const auto input = testing::Encode(type, in);
  auto output = testing::Encode(type, std::vector<double>(want.size(), -1));
  AllToAllOptions o{input.empty() ? nullptr : input.data(),
                    output.empty() ? nullptr : output.data(), 0, sends, recvs, type};
  const bool uniform = std::all_of(sends.begin(), sends.end(),
                                   [&](std::size_t n) { return n == sends[0]; }) &&
                       sends == recvs;
  if (count_form && uniform) {
    o.count = sends[0];
    o.send_counts.clear();
    o.recv_counts.clear();
  }
  comm.AllToAll(o);
  ASSERT_EQ(output, testing::Encode(type, want))
      << Name(mix) << ", " << Name(type)
      << (count_form ? ", count form" : ", per-peer form") << ", rank " << rank << " of "
      << size;
}

class AllToAllMixes : public ::testing::TestWithParam<TransportKind> {
 protected:
  CommunicatorOptions Options() const {
    CommunicatorOptions o;
    o.transport = GetParam();
    o.timeout = std::chrono::seconds(30);
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, AllToAllMixes,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return info.param == TransportKind::kShm ? "shm" : "tcp";
                         });

TEST_P(AllToAllMixes, EveryMixOfFormsMatchesTheReference) {
  const auto options = Options();
  for (int size : {1, 2, 3, 4, 5}) {
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, size,
                        options);
      for (Mix mix : kMixes) {
        for (DataType type : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
          for (bool count_form : {true, false}) {
            ASSERT_NO_FATAL_FAILURE(CheckMix(comm, mix, type, count_form));
          }
        }
      }
      // The sequence stayed in step: one more collective agrees.
      comm.Barrier();
    });
  }
}

// Every rank sends all it has to rank 0 (a popular expert): rank 0 receives
// 3 x 4 floats and sends 4; the op is modelled at the busiest side, 48 bytes,
// on every rank.
TEST_P(AllToAllMixes, TheModelPricesTheRankThatReceivesMost) {
  const auto options = Options();
  RunRanks(3, [&](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 3, options);
    const std::vector<float> in(4, static_cast<float>(rank));
    std::vector<float> out(rank == 0 ? 12 : 0);
    const std::vector<std::size_t> sends{4, 0, 0};
    const std::vector<std::size_t> recvs = rank == 0 ? std::vector<std::size_t>{4, 4, 4}
                                                     : std::vector<std::size_t>{0, 0, 0};
    comm.AllToAll({in.data(), out.empty() ? nullptr : out.data(), 0, sends, recvs,
                   DataType::kFloat32});
    if (rank == 0) {
      EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
    }
    EXPECT_EQ(comm.records().back().bytes, 48.0);
  });
}

// The case: rank 0 passes uneven sizes, rank 1 equal ones (as a
// count), then rank 1 all-zero splits (as a count of 0) while rank 0
// sends it nothing.
TEST_P(AllToAllMixes, UnevenOnOneRankAndACountOnTheOther) {
  const auto options = Options();
  RunRanks(2, [&](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
    std::vector<float> in{1, 2, 3, 4, 5, 6, 7, 8};
    if (rank == 1) in = {10, 11, 12, 13, 14, 15, 16, 17};
    std::vector<float> out(8, -1);
    if (rank == 0) {  // 4 to itself and 4 to rank 1; 4 from each: equal in all but form
      comm.AllToAll({in.data(), out.data(), 0, {4, 4}, {4, 4}, DataType::kFloat32});
    } else {
      comm.AllToAll({in.data(), out.data(), 4, {}, {}, DataType::kFloat32});
    }
    const std::vector<float> want = rank == 0
                                        ? std::vector<float>{1, 2, 3, 4, 10, 11, 12, 13}
                                        : std::vector<float>{5, 6, 7, 8, 14, 15, 16, 17};
    EXPECT_EQ(out, want);
    std::vector<float> out2(rank == 0 ? 3 : 0, -1);
    if (rank == 0) {  // 3 to itself, none to rank 1
      comm.AllToAll({in.data(), out2.data(), 0, {3, 0}, {3, 0}, DataType::kFloat32});
      EXPECT_EQ(out2, (std::vector<float>{1, 2, 3}));
    } else {
      comm.AllToAll({nullptr, nullptr, 0, {}, {}, DataType::kFloat32});
    }
  });
}

// Runs `body` on `size` ranks, expects it to fail within 10 s (far below
// the 30 s timeout: the ranks must not wait for it) and returns the error.
std::string FailureOf(int size, const CommunicatorOptions& options,
                      const std::function<void(Communicator&)>& body) {
  const auto start = std::chrono::steady_clock::now();
  try {
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, size,
                        options);
      comm.Barrier();  // so the failing all-to-all is #1
      body(comm);
    });
  } catch (const Error& e) {
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
        << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the mismatch went unnoticed";
  return "";
}

TEST_P(AllToAllMixes, AnotherCollectiveIsAMismatch) {
  const std::string what = FailureOf(2, Options(), [](Communicator& comm) {
    std::vector<float> in(4), out(4);
    if (comm.rank() == 0) {
      comm.AllToAll({in.data(), out.data(), 0, {1, 3}, {1, 2}, DataType::kFloat32});
    } else {
      comm.AllGather({in.data(), out.data(), 2, DataType::kFloat32});
    }
  });
  EXPECT_NE(what.find("mismatched collectives"), std::string::npos) << what;
  EXPECT_NE(what.find("alltoall #1 of per-peer sizes of float32"), std::string::npos)
      << what;
  EXPECT_NE(what.find("allgather #1 of 2 float32"), std::string::npos) << what;
}

TEST_P(AllToAllMixes, DifferentDtypesAreAMismatch) {
  const std::string what = FailureOf(2, Options(), [](Communicator& comm) {
    std::vector<float> in(4), out(4);
    const DataType type = comm.rank() == 0 ? DataType::kFloat32 : DataType::kInt32;
    comm.AllToAll({in.data(), out.data(), 2, {}, {}, type});
  });
  EXPECT_NE(what.find("mismatched collectives"), std::string::npos) << what;
  EXPECT_NE(what.find("alltoall #1 of 2 float32"), std::string::npos) << what;
  EXPECT_NE(what.find("alltoall #1 of 2 int32"), std::string::npos) << what;
}

// A count on one rank, per-peer sizes on the other that expect more from it.
TEST_P(AllToAllMixes, ACountDisagreeingWithPerPeerSizesIsNamed) {
  const std::string what = FailureOf(2, Options(), [](Communicator& comm) {
    std::vector<float> in(8), out(8);
    if (comm.rank() == 0) {
      comm.AllToAll({in.data(), out.data(), 2, {}, {}, DataType::kFloat32});
    } else {  // sends 2 to rank 0 as it expects, but expects 3 from it
      comm.AllToAll({in.data(), out.data(), 0, {2, 1}, {3, 1}, DataType::kFloat32});
    }
  });
  EXPECT_NE(what.find("alltoall #1"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0 sends 2 elements to rank 1, which expects 3"),
            std::string::npos)
      << what;
}

// Equal blocks on both ranks, of different sizes.
TEST_P(AllToAllMixes, DifferentCountsAreNamed) {
  const std::string what = FailureOf(3, Options(), [](Communicator& comm) {
    std::vector<float> in(9), out(9);
    const std::size_t count = comm.rank() == 2 ? 3 : 2;
    comm.AllToAll({in.data(), out.data(), count, {}, {}, DataType::kFloat32});
  });
  EXPECT_NE(what.find("alltoall #1 of "), std::string::npos) << what;
  const bool from_2 = what.find("rank 2 sends 3 elements to rank") != std::string::npos &&
                      what.find("which expects 2") != std::string::npos;
  const bool to_2 = what.find("sends 2 elements to rank 2, which expects 3") !=
                    std::string::npos;
  EXPECT_TRUE(from_2 || to_2) << what;
}

// A rank whose own block disagrees with itself: the others must not wait.
TEST_P(AllToAllMixes, ASelfDisagreementStopsEveryRank) {
  const std::string what = FailureOf(3, Options(), [](Communicator& comm) {
    std::vector<float> in(8), out(8);
    std::vector<std::size_t> sends{1, 1, 1}, recvs{1, 1, 1};
    if (comm.rank() == 1) sends[1] = 2;
    comm.AllToAll({in.data(), out.data(), 0, sends, recvs, DataType::kFloat32});
  });
  EXPECT_NE(what.find("alltoall #1"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 1 sends 2 elements to itself but expects 1"),
            std::string::npos)
      << what;
}

}  // namespace
}  // namespace neuron::collectives
