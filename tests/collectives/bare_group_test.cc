// The host algorithms over a bare group context: a transport and nothing of
// the communicator (no handshake, tuner or accounting), as Gloo's
// algorithms run over its Context. Also the context's per-operation
// timeout, which c10d sets for each call.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "algorithms.h"
#include "neuron/collectives/group_context.h"
#include "neuron/collectives/transport/shm_transport.h"
#include "neuron/runtime/error.h"
#include "rank_threads.h"

namespace neuron::collectives {
namespace {

using std::chrono::milliseconds;
using testing::RunRanks;

// A group of its own making: a shared-memory transport with windows.
class BareGroup : public GroupContext {
 public:
  BareGroup(Store& store, int rank, int size, milliseconds timeout)
      : GroupContext(rank, size, timeout) {
    transport::ShmOptions options;
    options.ring_bytes = 64u << 10;
    options.window_bytes = 256u << 10;
    transport_ = std::make_unique<transport::ShmTransport>(store, rank, size, options);
    windows_ = transport_->windows();
  }
};

TEST(BareGroup, RingAllReduceAndPairwiseAllToAllMatchTheReference) {
  constexpr int kSize = 3;
  RunRanks(kSize, [](int rank, Store& store) {
    BareGroup g(store, rank, kSize, std::chrono::seconds(30));
    std::vector<float> data(10);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank * 100 + i);
    RingAllReduce(g, reinterpret_cast<char*>(data.data()), data.size(), DataType::kFloat32,
                  ReduceOp::kSum, Label("allreduce"));
    for (std::size_t i = 0; i < data.size(); ++i) {
      EXPECT_EQ(data[i], static_cast<float>(300 + 3 * i)) << i;
    }
    // Rank r sends peer p r + p + 1 elements of value 10 r + p.
    std::vector<std::size_t> sends(kSize), recvs(kSize);
    std::vector<float> in, want;
    for (int p = 0; p < kSize; ++p) {
      sends[p] = static_cast<std::size_t>(rank + p + 1);
      recvs[p] = static_cast<std::size_t>(p + rank + 1);
      in.insert(in.end(), sends[p], static_cast<float>(10 * rank + p));
      want.insert(want.end(), recvs[p], static_cast<float>(10 * p + rank));
    }
    std::vector<float> out(want.size(), -1);
    PairwiseAllToAll(g, reinterpret_cast<const char*>(in.data()),
                     reinterpret_cast<char*>(out.data()), BlockLayout(sends, 4),
                     BlockLayout(recvs, 4), /*check_counts=*/true, Label("alltoall"));
    EXPECT_EQ(out, want);
  });
}

// The group's timeout is a minute; the operation's, set on the context,
// bounds the wait for a rank that never comes.
TEST(BareGroup, TheOperationsTimeoutBoundsItsWaits) {
  RunRanks(2, [](int rank, Store& store) {
    BareGroup g(store, rank, 2, std::chrono::minutes(1));
    if (rank == 1) {  // never joins the exchange; stays until rank 0 is done
      store.Wait({"done"}, std::chrono::seconds(30));
      return;
    }
    g.set_operation_timeout(milliseconds(200));
    char out = 1, in = 0;
    const auto start = std::chrono::steady_clock::now();
    try {
      g.Exchange(1, &out, 1, 1, &in, 1, Label("exchange #0"));
      FAIL() << "the exchange did not time out";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("exchange #0"), std::string::npos) << e.what();
    }
    store.Set("done", "1");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  });
}

}  // namespace
}  // namespace neuron::collectives
