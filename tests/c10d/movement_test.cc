// Data-movement operations of the neuron process group: every dtype,
// including ones the collectives cannot reduce (moved as bytes), equal and
// uneven sizes, lists and flat tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "group_threads.h"

namespace neuron::c10d {
namespace {

using testing::RunGroup;

const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kHalf,        at::kBFloat16,
                                            at::kChar,  at::kBool,        at::kLong,
                                            at::kShort, at::kComplexFloat};

// Rank r's block of n elements: distinct per rank and element.
at::Tensor Block(int64_t n, int rank, at::ScalarType type) {
  at::Tensor x = (at::arange(n, at::kLong) * 3 + rank * 100) % 97;
  if (type == at::kBool) x = x % 2;
  return x.to(type);
}

void ExpectEqual(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_TRUE(at::equal(got, want)) << what;
}

TEST(BackendNeuron, BroadcastGatherScatterAllGatherEveryDtype) {
  RunGroup(3, [](BackendNeuron& pg, int rank) {
    const int size = 3;
    for (at::ScalarType type : kTypes) {
      const std::string what = c10::toString(type);
      for (int64_t n : {0, 1, 257}) {
        // broadcast from rank 1
        std::vector<at::Tensor> b = {Block(n, rank, type)};
        ::c10d::BroadcastOptions bo;
        bo.rootRank = 1;
        pg.broadcast(b, bo)->wait();
        ExpectEqual(b[0], Block(n, 1, type), "broadcast " + what);
        // allgather, equal blocks
        std::vector<std::vector<at::Tensor>> out(1);
        for (int r = 0; r < size; ++r) out[0].push_back(at::empty({n}, type));
        std::vector<at::Tensor> in = {Block(n, rank, type)};
        pg.allgather(out, in, {})->wait();
        for (int r = 0; r < size; ++r)
          ExpectEqual(out[0][r], Block(n, r, type), "allgather " + what);
        // _allgather_base
        at::Tensor flat = at::empty({n * size}, type);
        pg._allgather_base(flat, in[0], {})->wait();
        ExpectEqual(flat,
                    at::cat({Block(n, 0, type), Block(n, 1, type), Block(n, 2, type)}),
                    "_allgather_base " + what);
        // gather to rank 2
        ::c10d::GatherOptions go;
        go.rootRank = 2;
        std::vector<std::vector<at::Tensor>> gathered(rank == 2 ? 1 : 0);
        if (rank == 2) {
          for (int r = 0; r < size; ++r) gathered[0].push_back(at::empty({n}, type));
        }
        pg.gather(gathered, in, go)->wait();
        if (rank == 2) {
          for (int r = 0; r < size; ++r)
            ExpectEqual(gathered[0][r], Block(n, r, type), "gather " + what);
        }
        // scatter from rank 0: rank r gets Block(n, 10 + r)
        ::c10d::ScatterOptions so;
        so.rootRank = 0;
        std::vector<std::vector<at::Tensor>> pieces(rank == 0 ? 1 : 0);
        if (rank == 0) {
          for (int r = 0; r < size; ++r) pieces[0].push_back(Block(n, 10 + r, type));
        }
        std::vector<at::Tensor> mine = {at::empty({n}, type)};
        pg.scatter(mine, pieces, so)->wait();
        ExpectEqual(mine[0], Block(n, 10 + rank, type), "scatter " + what);
      }
    }
  });
}

TEST(BackendNeuron, UnevenAllGatherAndAllToAll) {
  RunGroup(4, [](BackendNeuron& pg, int rank) {
    const int size = 4;
    for (at::ScalarType type : {at::kFloat, at::kShort}) {
      // allgather with rank r contributing r elements (rank 0 none).
      std::vector<std::vector<at::Tensor>> out(1);
      for (int r = 0; r < size; ++r) out[0].push_back(at::empty({r}, type));
      std::vector<at::Tensor> in = {Block(rank, rank, type)};
      pg.allgather(out, in, {})->wait();
      for (int r = 0; r < size; ++r)
        ExpectEqual(out[0][r], Block(r, r, type), "uneven allgather");
      // all_to_all_single with uneven splits: rank s sends s+d+1 rows of
      // 2 columns to rank d.
      std::vector<int64_t> send_splits, recv_splits;
      std::vector<at::Tensor> send_blocks, want_blocks;
      for (int p = 0; p < size; ++p) {
        send_splits.push_back(rank + p + 1);
        recv_splits.push_back(p + rank + 1);
        send_blocks.push_back(
            Block(2 * (rank + p + 1), rank * 10 + p, type).reshape({-1, 2}));
        want_blocks.push_back(
            Block(2 * (p + rank + 1), p * 10 + rank, type).reshape({-1, 2}));
      }
      at::Tensor input = at::cat(send_blocks);
      at::Tensor output = at::empty_like(at::cat(want_blocks));
      pg.alltoall_base(output, input, recv_splits, send_splits, {})->wait();
      ExpectEqual(output, at::cat(want_blocks), "alltoall_base uneven");
      // equal splits (empty split lists)
      std::vector<int64_t> none;
      at::Tensor eq_in = Block(8, rank, type), eq_out = at::empty({8}, type);
      pg.alltoall_base(eq_out, eq_in, none, none, {})->wait();
      std::vector<at::Tensor> eq_want;
      for (int p = 0; p < size; ++p)
        eq_want.push_back(Block(8, p, type).slice(0, 2 * rank, 2 * rank + 2));
      ExpectEqual(eq_out, at::cat(eq_want), "alltoall_base equal");
      // alltoall, list form
      std::vector<at::Tensor> list_in, list_out;
      for (int p = 0; p < size; ++p) {
        list_in.push_back(Block(p + 1, rank * 10 + p, type));
        list_out.push_back(at::empty({rank + 1}, type));
      }
      pg.alltoall(list_out, list_in, {})->wait();
      for (int p = 0; p < size; ++p)
        ExpectEqual(list_out[p], Block(rank + 1, p * 10 + rank, type), "alltoall");
    }
    // allgather_coalesced with mixed dtypes.
    std::vector<at::Tensor> in = {Block(3, rank, at::kFloat), Block(2, rank, at::kBool),
                                  Block(5, rank, at::kLong)};
    std::vector<std::vector<at::Tensor>> out(size);
    for (int r = 0; r < size; ++r) {
      for (const auto& t : in) out[r].push_back(at::empty_like(t));
    }
    pg.allgather_coalesced(out, in, {})->wait();
    for (int r = 0; r < size; ++r) {
      ExpectEqual(out[r][0], Block(3, r, at::kFloat), "coalesced float");
      ExpectEqual(out[r][1], Block(2, r, at::kBool), "coalesced bool");
      ExpectEqual(out[r][2], Block(5, r, at::kLong), "coalesced long");
    }
    // A non-contiguous output of an allgather is written in place.
    at::Tensor base = at::zeros({4, 3});
    std::vector<std::vector<at::Tensor>> cols(1);
    for (int r = 0; r < size; ++r) cols[0].push_back(base.select(0, r).slice(0, 0, 3, 2));
    std::vector<at::Tensor> two = {at::full({2}, float(rank + 1))};
    pg.allgather(cols, two, {})->wait();
    ExpectEqual(base.select(1, 0), at::tensor({1.f, 2.f, 3.f, 4.f}), "strided allgather");
    ExpectEqual(base.select(1, 1), at::zeros({4}), "strided allgather untouched");
  });
}

// Rows rank a sends rank b in the all-to-all mixes below; each rank passes
// its splits in its own form (uneven, equal, none, all zero), as Gloo
// accepts them.
using RowsOf = int64_t (*)(int a, int b);
int64_t Uneven(int a, int b) { return (a + 2 * b) % 3 + 1; }
// The issue's mix: ranks 0 and 3 uneven, rank 1 equal splits (2 rows
// everywhere), rank 2 no splits at all.
int64_t IssueMix(int a, int b) { return a == 1 || a == 2 || b == 1 || b == 2 ? 2 : Uneven(a, b); }
// Rank 0 all-zero splits, rank 3 sends nothing, rank 1 receives nothing.
int64_t ZeroMix(int a, int b) { return a == 0 || b == 0 || a == 3 || b == 1 ? 0 : Uneven(a, b); }
int64_t AllZero(int, int) { return 0; }

// What rank a sends rank b: rows x 2 columns.
at::Tensor Rows(RowsOf rows, int a, int b, at::ScalarType type) {
  return Block(2 * rows(a, b), a * 10 + b, type).reshape({-1, 2});
}

// all_to_all_single on this rank of 4 with `rows`; ranks in `no_splits`
// pass none (their blocks are equal).
void CheckAllToAllSingle(BackendNeuron& pg, int rank, RowsOf rows, at::ScalarType type,
                         std::initializer_list<int> no_splits, const std::string& what) {
  std::vector<int64_t> send_splits, recv_splits;
  std::vector<at::Tensor> send_blocks, want_blocks;
  for (int p = 0; p < 4; ++p) {
    send_splits.push_back(rows(rank, p));
    recv_splits.push_back(rows(p, rank));
    send_blocks.push_back(Rows(rows, rank, p, type));
    want_blocks.push_back(Rows(rows, p, rank, type));
  }
  if (std::find(no_splits.begin(), no_splits.end(), rank) != no_splits.end()) {
    send_splits.clear();
    recv_splits.clear();
  }
  at::Tensor input = at::cat(send_blocks), want = at::cat(want_blocks);
  at::Tensor output = at::full_like(want, 7);
  pg.alltoall_base(output, input, recv_splits, send_splits, {})->wait();
  ExpectEqual(output, want, "all_to_all_single, " + what + ", rank " + std::to_string(rank));
}

void CheckAllToAllList(BackendNeuron& pg, int rank, RowsOf rows, at::ScalarType type,
                       const std::string& what) {
  std::vector<at::Tensor> ins, outs;
  for (int p = 0; p < 4; ++p) {
    ins.push_back(Rows(rows, rank, p, type));
    outs.push_back(at::full_like(Rows(rows, p, rank, type), 7));
  }
  pg.alltoall(outs, ins, {})->wait();
  for (int p = 0; p < 4; ++p) {
    ExpectEqual(outs[p], Rows(rows, p, rank, type),
                "all_to_all, " + what + ", rank " + std::to_string(rank) + " from " +
                    std::to_string(p));
  }
}

TEST(BackendNeuron, AllToAllTakesAnyMixOfSplitsAcrossRanks) {
  RunGroup(4, [](BackendNeuron& pg, int rank) {
    for (at::ScalarType type : {at::kFloat, at::kShort}) {
      CheckAllToAllSingle(pg, rank, IssueMix, type, {2}, "uneven, equal and no splits");
      CheckAllToAllSingle(pg, rank, ZeroMix, type, {}, "zero splits");
      CheckAllToAllSingle(pg, rank, AllZero, type, {0, 1}, "all zero");
      CheckAllToAllSingle(pg, rank, IssueMix, type, {1, 2}, "uneven and no splits");
      CheckAllToAllList(pg, rank, IssueMix, type, "one rank equal");
      CheckAllToAllList(pg, rank, ZeroMix, type, "zero blocks");
      CheckAllToAllList(pg, rank, AllZero, type, "all zero");
    }
  });
}

// Splits that disagree between sender and receiver, and dtypes that differ:
// every rank fails at once, naming the op, its sequence number and sizes.
TEST(BackendNeuron, AllToAllMismatchesAreNamed) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(2);
  RunGroup(2, [&](BackendNeuron& pg, int rank) {
    // rank 0 sends 2 rows to rank 1, which expects 3.
    std::vector<int64_t> send = {2, 2}, recv = rank == 1 ? std::vector<int64_t>{3, 2}
                                                         : std::vector<int64_t>{2, 2};
    at::Tensor in = at::zeros({4, 2}), out = at::zeros({rank == 1 ? 5 : 4, 2});
    errors[rank] = testing::ErrorOf(pg.alltoall_base(out, in, recv, send, {}));
  }, std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const auto& e : errors) {
    EXPECT_NE(e.find("alltoall #0"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 0 sends 4 elements to rank 1, which expects 6"), std::string::npos)
        << e;
  }
  RunGroup(2, [&](BackendNeuron& pg, int rank) {
    at::Tensor in = at::zeros({4}, rank == 0 ? at::kFloat : at::kInt);
    at::Tensor out = at::zeros_like(in);
    std::vector<int64_t> none;
    errors[rank] = testing::ErrorOf(pg.alltoall_base(out, in, none, none, {}));
  }, std::chrono::seconds(30));
  for (const auto& e : errors) {
    EXPECT_NE(e.find("mismatched collectives"), std::string::npos) << e;
    EXPECT_NE(e.find("alltoall #0 of 2 float32"), std::string::npos) << e;
    EXPECT_NE(e.find("alltoall #0 of 2 int32"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace neuron::c10d
