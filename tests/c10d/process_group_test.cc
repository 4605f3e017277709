// The neuron process group's machinery: work handles and futures,
// point-to-point, barriers, statistics, and every kind of bad input.
#include <ATen/core/ivalue.h>
#include <gtest/gtest.h>

#include "group_threads.h"
#include "neuron/runtime/error.h"

namespace neuron::c10d {
namespace {

using namespace std::chrono_literals;
using testing::ErrorOf;
using testing::RunGroup;

TEST(BackendNeuron, AsyncWorkAndFutureCarryTheResult) {
  RunGroup(3, [](BackendNeuron& pg, int rank) {
    EXPECT_EQ(pg.getBackendName(), "neuron");
    std::vector<std::vector<at::Tensor>> tensors;
    std::vector<c10::intrusive_ptr<::c10d::Work>> works;
    for (int i = 0; i < 10; ++i) {
      tensors.push_back({at::full({100}, float(rank + i))});
      works.push_back(pg.allreduce(tensors.back(), {}));
    }
    auto chained = works[9]->getFuture()->then(
        [](c10::ivalue::Future& f) {
          return c10::IValue(f.value().toTensorVector()[0].sum());
        },
        c10::TensorType::get());
    for (int i = 0; i < 10; ++i) {
      EXPECT_TRUE(works[i]->wait());
      EXPECT_TRUE(works[i]->isCompleted());
      EXPECT_TRUE(works[i]->isSuccess());
      EXPECT_EQ(works[i]->exception(), nullptr);
      EXPECT_EQ(works[i]->result()[0][0].item<float>(), 3.0f + 3 * i);
    }
    chained->wait();
    EXPECT_EQ(chained->value().toTensor().item<float>(), 100 * (3.0f + 27));
    EXPECT_EQ(pg.getSequenceNumberForGroup(), 10u);
    pg.barrier({})->wait();
    EXPECT_EQ(pg.Records().size(), 11u);  // ten allreduces and the barrier
    EXPECT_EQ(pg.Totals().operations, 11u);
    pg.ResetStats();
    EXPECT_EQ(pg.Totals().operations, 0u);
  });
}

TEST(BackendNeuron, SendRecvByTagAndFromAnySource) {
  RunGroup(3, [](BackendNeuron& pg, int rank) {
    if (rank == 0) {
      // Two tags sent in one order and received in the other.
      std::vector<at::Tensor> a = {at::full({4}, 1.0f)}, b = {at::full({1 << 18}, 2.0f)};
      auto wa = pg.send(a, 1, /*tag=*/5);
      auto wb = pg.send(b, 1, /*tag=*/6);
      wa->wait();
      wb->wait();
      std::vector<at::Tensor> any = {at::empty({3}, at::kLong)};
      auto w = pg.recvAnysource(any, 9);
      w->wait();
      EXPECT_EQ(w->sourceRank(), 2);
      EXPECT_EQ(any[0][2].item<int64_t>(), 42);
    } else if (rank == 1) {
      std::vector<at::Tensor> b = {at::empty({1 << 18})}, a = {at::empty({4})};
      auto wb = pg.recv(b, 0, 6);
      auto wa = pg.recv(a, 0, 5);
      wb->wait();
      wa->wait();
      EXPECT_EQ(b[0][(1 << 18) - 1].item<float>(), 2.0f);
      EXPECT_EQ(a[0][3].item<float>(), 1.0f);
      // A strided destination is written in place.
      at::Tensor base = at::zeros({3, 2});
      std::vector<at::Tensor> column = {base.select(1, 1)};
      pg.recv(column, 2, 0)->wait();
      EXPECT_TRUE(at::equal(base.select(1, 1), at::tensor({7.f, 8.f, 9.f})));
      EXPECT_TRUE(at::equal(base.select(1, 0), at::zeros({3})));
    } else {
      std::vector<at::Tensor> c = {at::tensor({7.f, 8.f, 9.f})};
      pg.send(c, 1, 0)->wait();
      std::vector<at::Tensor> msg = {at::full({3}, 42, at::kLong)};
      pg.send(msg, 0, 9)->wait();
    }
    // A receive still waiting does not block the collectives.
    std::vector<at::Tensor> late = {at::empty({2})};
    c10::intrusive_ptr<::c10d::Work> pending;
    if (rank == 2) pending = pg.recv(late, 0, 77);
    std::vector<at::Tensor> one = {at::ones({1})};
    pg.allreduce(one, {})->wait();
    EXPECT_EQ(one[0].item<float>(), 3.0f);
    if (rank == 0) {
      std::vector<at::Tensor> msg = {at::full({2}, 5.0f)};
      pg.send(msg, 2, 77)->wait();
    }
    if (rank == 2) {
      pending->wait();
      EXPECT_EQ(late[0][1].item<float>(), 5.0f);
    }
  });
}

TEST(BackendNeuron, BadArgumentsThrowAtTheCallNamingRankOpAndDtype) {
  RunGroup(2, [](BackendNeuron& pg, int rank) {
    auto message = [](auto&& call) -> std::string {
      try {
        call();
      } catch (const InvalidUsage& e) {
        return e.what();
      }
      return "no error";
    };
    std::vector<at::Tensor> shorts = {at::ones({3}, at::kShort)};
    std::string m = message([&] { pg.allreduce(shorts, {}); });
    EXPECT_NE(m.find("neuron rank " + std::to_string(rank)), std::string::npos) << m;
    EXPECT_NE(m.find("allreduce #0"), std::string::npos) << m;
    EXPECT_NE(m.find("Short"), std::string::npos) << m;
    std::vector<at::Tensor> floats = {at::ones({3})};
    m = message(
        [&] { pg.allreduce(floats, {::c10d::ReduceOp(::c10d::ReduceOp::BXOR)}); });
    EXPECT_NE(m.find("bxor"), std::string::npos) << m;
    std::vector<at::Tensor> sparse = {at::ones({2, 2}).to_sparse()};
    m = message([&] { pg.broadcast(sparse, {}); });
    EXPECT_NE(m.find("sparse"), std::string::npos) << m;
    ::c10d::BroadcastOptions bad_root;
    bad_root.rootRank = 2;
    m = message([&] { pg.broadcast(floats, bad_root); });
    EXPECT_NE(m.find("root rank 2"), std::string::npos) << m;
    m = message([&] { pg.send(floats, rank, 0); });
    EXPECT_NE(m.find("send"), std::string::npos) << m;
    std::vector<std::vector<at::Tensor>> three(
        1, {at::ones({3}), at::ones({3}), at::ones({3})});
    m = message([&] { pg.allgather(three, floats, {}); });
    EXPECT_NE(m.find("3 tensors; the group has 2"), std::string::npos) << m;
    // Nothing was queued: the group still works.
    pg.allreduce(floats, {})->wait();
    EXPECT_EQ(floats[0][0].item<float>(), 2.0f);
  });
}

TEST(BackendNeuron, SizesThatDifferAcrossRanksFailEveryRank) {
  RunGroup(2, [](BackendNeuron& pg, int rank) {
    std::vector<at::Tensor> t = {at::ones({rank == 0 ? 10 : 20})};
    const std::string m = ErrorOf(pg.allreduce(t, {}));
    EXPECT_NE(m.find("neuron rank " + std::to_string(rank)), std::string::npos) << m;
    EXPECT_NE(m.find("allreduce #0"), std::string::npos) << m;
  });
}

TEST(BackendNeuron, AMissingRankTimesOutAndMonitoredBarrierNamesIt) {
  RunGroup(
      3,
      [](BackendNeuron& pg, int rank) {
        if (rank == 2) return;  // never arrives
        ::c10d::BarrierOptions opts;
        opts.timeout = 300ms;
        try {
          pg.monitoredBarrier(opts, /*wait_all_ranks=*/true);
          ADD_FAILURE() << "monitoredBarrier passed without rank 2";
        } catch (const TimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("Rank 2 failed to pass monitoredBarrier"),
                    std::string::npos)
              << e.what();
        }
        std::vector<at::Tensor> t = {at::ones({4})};
        const std::string m = ErrorOf(pg.allreduce(t, {}));
        EXPECT_NE(m.find("allreduce #0"), std::string::npos) << m;
        EXPECT_NE(m.find("2"), std::string::npos) << m;
      },
      1500ms);
}

TEST(BackendNeuron, APerCallTimeoutBoundsThatOperationOnly) {
  RunGroup(
      2,
      [](BackendNeuron& pg, int rank) {
        if (rank == 1) return;  // never arrives
        std::vector<at::Tensor> t = {at::ones({4})};
        ::c10d::AllreduceOptions opts;
        opts.timeout = 300ms;
        const auto start = std::chrono::steady_clock::now();
        const std::string m = ErrorOf(pg.allreduce(t, opts));
        const auto took = std::chrono::steady_clock::now() - start;
        EXPECT_NE(m.find("allreduce #0"), std::string::npos) << m;
        EXPECT_NE(m.find("timed out"), std::string::npos) << m;
        // The group's own timeout is a minute: the call's 300 ms applied.
        EXPECT_LT(took, 10s) << m;
      },
      60s);
}

TEST(BackendNeuron, SetTimeoutBoundsTheOperationsAfterIt) {
  RunGroup(
      2,
      [](BackendNeuron& pg, int rank) {
        if (rank == 1) return;  // never arrives
        pg.setTimeout(300ms);
        std::vector<at::Tensor> t = {at::ones({4})};
        const auto start = std::chrono::steady_clock::now();
        const std::string m = ErrorOf(pg.allreduce(t, {}));
        EXPECT_NE(m.find("Timed out"), std::string::npos) << m;
        // The group was made with a minute: setTimeout's 300 ms applied.
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << m;
        EXPECT_THROW(pg.setTimeout(0ms), InvalidUsage);
      },
      60s);
}

TEST(BackendNeuron, AZeroOrNegativeTimeoutIsInvalidNotATimeout) {
  // The group's own: refused when it is made, naming it.
  for (const auto timeout : {0ms, -5ms}) {
    try {
      RunGroup(1, [](BackendNeuron&, int) {}, timeout);
      FAIL() << "a group made with " << timeout.count() << " ms";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("neuron rank 0 (group test, size 1): the timeout "
                                           "must be positive, got " +
                                           std::to_string(timeout.count()) + " ms"),
                std::string::npos)
          << e.what();
    }
  }
  // A call's: refused at the call, naming the op, before anything waits and
  // without taking a sequence number (here on rank 0 only: the ranks stay in
  // step).
  RunGroup(2, [](BackendNeuron& pg, int rank) {
    std::vector<at::Tensor> t = {at::ones({4})};
    ::c10d::AllreduceOptions opts;
    opts.timeout = 0ms;
    if (rank == 1) {
      pg.allreduce(t, {})->wait();
      EXPECT_TRUE(t[0].equal(at::full({4}, 2.0f)));
      return;
    }
    try {
      pg.allreduce(t, opts);
      FAIL() << "an allreduce with a 0 ms timeout";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce #0: the timeout must be positive, got 0 ms"),
                std::string::npos)
          << e.what();
    }
    // The group goes on: the same call with the group's timeout.
    pg.allreduce(t, {})->wait();
    EXPECT_TRUE(t[0].equal(at::full({4}, 2.0f)));
  });
}

}  // namespace
}  // namespace neuron::c10d
