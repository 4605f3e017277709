#include "neuron/collectives/async_communicator.h"

#include <gtest/gtest.h>

#include <thread>

#include "neuron/collectives/store/prefix_store.h"
#include "neuron/runtime/error.h"
#include "rank_threads.h"

namespace neuron::collectives {
namespace {

using namespace std::chrono_literals;
using testing::RunRanks;

std::shared_ptr<Store> Borrow(Store& store) {
  return std::shared_ptr<Store>(&store, [](Store*) {});
}

TEST(AsyncCommunicator, QueuedOperationsRunInIssueOrder) {
  RunRanks(4, [](int rank, Store& store) {
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, 4));
    constexpr int kOps = 20;
    std::vector<std::vector<float>> buffers(kOps, std::vector<float>(1000));
    std::vector<std::shared_ptr<Work>> works;
    for (int i = 0; i < kOps; ++i) {
      std::fill(buffers[i].begin(), buffers[i].end(), static_cast<float>(rank + i));
      float* data = buffers[i].data();
      works.push_back(async.Enqueue(
          [data](Communicator& c) { c.AllReduce({data, 1000, DataType::kFloat32}); },
          "allreduce"));
    }
    for (int i = 0; i < kOps; ++i) {
      works[i]->Wait();
      EXPECT_TRUE(works[i]->Test());
      EXPECT_EQ(works[i]->exception(), nullptr);
      EXPECT_EQ(buffers[i][999], 0 + 1 + 2 + 3 + 4.0f * i) << i;
    }
  });
}

// A receive that waits for a message sent only after a collective must not
// hold up that collective: point-to-point runs on its own lane. (On one lane
// rank 0's receive would block its allreduce, and rank 1 would never send.)
TEST(AsyncCommunicator, PointToPointLaneRunsBesideTheCollectives) {
  RunRanks(2, [](int rank, Store& store) {
    using Lane = AsyncCommunicator::Lane;
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, 2));
    std::vector<std::int64_t> message(300000, -1);  // larger than the shm ring
    std::int64_t sum = rank + 1;
    std::shared_ptr<Work> recv;
    if (rank == 0) {
      recv = async.Enqueue([&](Communicator& c) {
        c.Recv(1, message.data(), message.size() * sizeof(std::int64_t), 7);
      }, "recv", Lane::kPointToPoint);
    }
    async.Enqueue([&](Communicator& c) { c.AllReduce({&sum, 1, DataType::kInt64}); })->Wait();
    EXPECT_EQ(sum, 3);
    if (rank == 1) {
      for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::int64_t>(i);
      async.Enqueue([&](Communicator& c) {
        c.Send(0, message.data(), message.size() * sizeof(std::int64_t), 7);
      }, "send", Lane::kPointToPoint)->Wait();
    } else {
      recv->Wait();
      EXPECT_EQ(message[299999], 299999);
      EXPECT_EQ(message[0], 0);
    }
    // Completion callbacks run once, with the outcome; late ones at once.
    int called = 0;
    auto barrier = async.Enqueue([](Communicator& c) { c.Barrier(); }, "barrier");
    barrier->Wait();
    barrier->OnDone([&](std::exception_ptr e) { called += e == nullptr ? 1 : 100; });
    EXPECT_EQ(called, 1);
  });
}

// Sends are buffered: a ring in which every rank first sends a message far
// larger than the shared-memory ring, then receives, completes (with
// blocking sends it would deadlock) -- directly, and through the lane.
TEST(AsyncCommunicator, LargeSendsAroundARingDoNotDeadlock) {
  constexpr std::size_t kCount = 1u << 20;  // 8 MiB of int64
  RunRanks(3, [](int rank, Store& store) {
    using Lane = AsyncCommunicator::Lane;
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    std::vector<std::int64_t> out(kCount, rank), in(kCount, -1);
    {
      Communicator comm(Borrow(store), rank, 3);
      comm.set_buffered_sends(true);
      comm.Send(next, out.data(), kCount * 8, 1);
      EXPECT_EQ(comm.Recv(prev, in.data(), kCount * 8, 1), prev);
      EXPECT_EQ(in[kCount - 1], prev);
      while (comm.ProgressSends(std::chrono::milliseconds(10))) {
      }
      comm.Barrier();
    }
    PrefixStore second("second", Borrow(store));
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(second), rank, 3));
    std::fill(in.begin(), in.end(), -1);
    auto send = async.Enqueue([&](Communicator& c) { c.Send(next, out.data(), kCount * 8, 2); },
                              "send", Lane::kPointToPoint);
    auto recv = async.Enqueue([&](Communicator& c) { c.Recv(prev, in.data(), kCount * 8, 2); },
                              "recv", Lane::kPointToPoint);
    send->Wait();
    recv->Wait();
    EXPECT_EQ(in[0], prev);
    // Only the receiver's lane is busy afterwards: the sender's idle lane
    // keeps pushing bytes of a send nobody waits for.
    if (rank == 0) {
      async.Enqueue([&](Communicator& c) { c.Send(1, out.data(), kCount * 8, 3); }, "send",
                    Lane::kPointToPoint)->Wait();
    } else if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      async.Enqueue([&](Communicator& c) { c.Recv(0, in.data(), kCount * 8, 3); }, "recv",
                    Lane::kPointToPoint)->Wait();
      EXPECT_EQ(in[kCount - 1], 0);
    }
  });
}

TEST(AsyncCommunicator, ErrorsReachTheWorkHandle) {
  std::vector<std::exception_ptr> errors(2);
  RunRanks(2, [&](int rank, Store& store) {
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, 2));
    std::vector<float> data(rank == 0 ? 10 : 20);
    auto work = async.Enqueue([&](Communicator& c) {
      c.AllReduce({data.data(), data.size(), DataType::kFloat32});
    });
    try {
      work->Wait();
    } catch (...) {
    }
    EXPECT_TRUE(work->Test());
    errors[rank] = work->exception();
    // The communicator was aborted: later work fails without running.
    auto later = async.Enqueue([](Communicator& c) { c.Barrier(); }, "barrier");
    EXPECT_THROW(later->Wait(), Error);
  });
  for (const auto& e : errors) {
    ASSERT_NE(e, nullptr);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("mismatched collectives"), std::string::npos)
          << err.what();
    }
  }
}

TEST(AsyncCommunicator, WaitWithTimeoutLeavesTheWorkRunning) {
  RunRanks(2, [](int rank, Store& store) {
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, 2));
    if (rank == 1) std::this_thread::sleep_for(300ms);  // arrive late
    auto work = async.Enqueue([](Communicator& c) { c.Barrier(); }, "barrier");
    if (rank == 0) {
      EXPECT_THROW(work->Wait(50ms), TimeoutError);
      EXPECT_FALSE(work->Test());
    }
    work->Wait();  // completes once rank 1 arrives
  });
}

TEST(AsyncCommunicator, AbortFailsTheRunningOperationOnEveryRank) {
  RunRanks(3, [](int rank, Store& store) {
    AsyncCommunicator async(std::make_unique<Communicator>(Borrow(store), rank, 3));
    async.Enqueue([](Communicator& c) { c.Barrier(); })->Wait();
    // Everyone is past the first barrier before rank 2 aborts.
    store.Set("past/" + std::to_string(rank), "");
    store.Wait({"past/0", "past/1", "past/2"});
    if (rank == 2) {
      async.Abort("rank 2 is shutting down");
      return;
    }
    auto work = async.Enqueue([](Communicator& c) { c.Barrier(); }, "barrier");
    try {
      work->Wait(30s);
      FAIL() << "a barrier completed without rank 2";
    } catch (const RemoteError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 is shutting down"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace neuron::collectives
