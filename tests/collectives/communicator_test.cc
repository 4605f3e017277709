// Every collective, swept over world size x count x dtype x op x algorithm,
// against a naive reference (gather everything, reduce in rank order).
#include "neuron/collectives/communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "neuron/collectives/half.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/store/prefix_store.h"
#include "neuron/collectives/transport/shared_buffers.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/sim_clock.h"
#include "dtype_values.h"
#include "rank_threads.h"

namespace neuron::collectives {
namespace {

using namespace std::chrono_literals;
using testing::RunRanks;

const int kWorldSizes[] = {1, 2, 3, 4, 5, 7, 8, 16};
const std::size_t kCounts[] = {0, 1, 1001, 1 << 16};
const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt8, DataType::kUInt8,
                           DataType::kInt32, DataType::kInt64, DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kAvg, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

using testing::Supported;

// Rank r's input: small integers (exact in every dtype, so any reduction
// order gives the same bits); products use only 1 and -1 (or 1 and 2 for
// unsigned) so they stay in range at 16 ranks.
std::vector<unsigned char> Input(DataType type, ReduceOp op, int rank, std::size_t count) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const long k = static_cast<long>((rank * 7 + i * 13) % 5);
    if (type == DataType::kBool) {
      values[i] = k % 2;
    } else if (op == ReduceOp::kProduct) {
      values[i] = (type == DataType::kUInt8) ? 1 : (k % 2 ? -1 : 1);
    } else if (type == DataType::kUInt8) {
      values[i] = static_cast<double>(k);
    } else {
      values[i] = static_cast<double>(k - 2);
    }
  }
  return testing::Encode(type, values);
}

// The naive reference: every rank's input, reduced in rank order.
std::vector<unsigned char> Reference(DataType type, ReduceOp op, int size, std::size_t count) {
  std::vector<std::vector<unsigned char>> inputs;
  std::vector<const void*> pointers;
  for (int r = 0; r < size; ++r) inputs.push_back(Input(type, op, r, count));
  for (auto& in : inputs) pointers.push_back(in.data());
  std::vector<unsigned char> out(count * ElementSize(type));
  if (count > 0) {
    ReduceInputs(type, op, pointers.data(), pointers.size(), out.data(), count,
                 static_cast<std::size_t>(size));
  }
  return out;
}

// Whether the allreduce sweep covers `type` x `op` at `count`: every
// supported pair, large counts on a representative subset of types.
bool Swept(DataType type, ReduceOp op, std::size_t count) {
  if (!Supported(type, op)) return false;
  return count != (1 << 16) || type == DataType::kFloat32 || type == DataType::kBFloat16 ||
         type == DataType::kInt64;
}

// Reference() of each (type, op, count) at one world size, computed once
// before its ranks start: each rank of each algorithm recomputing it made
// the sweeps spend their time there (size^2 inputs at 16 ranks).
using ReferenceKey = std::tuple<DataType, ReduceOp, std::size_t>;
using References = std::map<ReferenceKey, std::vector<unsigned char>>;

// Float averages of integers are not exact: compare those within 1 ulp of
// the dtype's precision instead of bitwise.
bool InexactAverage(DataType type, ReduceOp op) {
  return op == ReduceOp::kAvg && IsFloatingPoint(type);
}

// Each sweep runs over both transports.
class CommunicatorSweep : public ::testing::TestWithParam<TransportKind> {
 protected:
  CommunicatorOptions Options() const {
    CommunicatorOptions o;
    o.transport = GetParam();
    return o;
  }
  std::vector<Algorithm> AllReduceAlgorithms() const {
    if (GetParam() == TransportKind::kTcp) {
      return {Algorithm::kRing, Algorithm::kRecursiveDoubling, Algorithm::kRabenseifner};
    }
    return {Algorithm::kDirect, Algorithm::kRing, Algorithm::kRecursiveDoubling,
            Algorithm::kRabenseifner};
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, CommunicatorSweep,
                         ::testing::Values(TransportKind::kShm, TransportKind::kTcp),
                         [](const auto& info) {
                           return info.param == TransportKind::kShm ? "shm" : "tcp";
                         });

TEST_P(CommunicatorSweep, AllReduceMatchesTheReference) {
  const auto options = Options();
  const auto algorithms = AllReduceAlgorithms();
  for (int size : kWorldSizes) {
    References references;
    for (std::size_t count : kCounts) {
      for (DataType type : kTypes) {
        for (ReduceOp op : kOps) {
          if (Swept(type, op, count)) references[{type, op, count}] = Reference(type, op, size, count);
        }
      }
    }
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm(std::make_shared<PrefixStore>("c", std::shared_ptr<Store>(&store, [](Store*) {})),
                        rank, size, options);
      for (Algorithm algorithm : algorithms) {
        for (std::size_t count : kCounts) {
          for (DataType type : kTypes) {
            for (ReduceOp op : kOps) {
              if (!Swept(type, op, count)) continue;
              auto data = Input(type, op, rank, count);
              comm.AllReduce({data.data(), count, type, op, algorithm});
              if (InexactAverage(type, op)) continue;  // checked below
              ASSERT_EQ(data, references.at({type, op, count}))
                  << "allreduce " << Name(algorithm) << " " << Name(type) << " " << Name(op)
                  << " count " << count << " size " << size << " rank " << rank;
            }
          }
        }
      }
    });
  }
}

TEST_P(CommunicatorSweep, FloatResultsAreBitwiseIdenticalOnEveryRankAndRun) {
  constexpr int kSize = 7;
  constexpr std::size_t kCount = 10007;
  const auto options = Options();
  for (Algorithm algorithm : AllReduceAlgorithms()) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      std::vector<std::vector<float>> results(2 * kSize);
      for (int run = 0; run < 2; ++run) {
        RunRanks(kSize, [&](int rank, Store& store) {
          Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, kSize, options);
          std::mt19937 rng(rank);
          std::normal_distribution<float> dist;
          std::vector<float> data(kCount);
          for (auto& x : data) x = dist(rng);
          comm.AllReduce({data.data(), kCount, DataType::kFloat32, op, algorithm});
          results[run * kSize + rank] = data;
        });
      }
      for (const auto& r : results) {
        ASSERT_EQ(std::memcmp(r.data(), results[0].data(), kCount * sizeof(float)), 0)
            << Name(algorithm) << " " << Name(op);
      }
      // And close to the naive sum (the order differs, the value does not).
      std::vector<double> naive(kCount, 0);
      for (int rank = 0; rank < kSize; ++rank) {
        std::mt19937 rng(rank);
        std::normal_distribution<float> dist;
        for (auto& x : naive) x += dist(rng);
      }
      for (std::size_t i = 0; i < kCount; ++i) {
        const double expected = op == ReduceOp::kAvg ? naive[i] / kSize : naive[i];
        ASSERT_NEAR(results[0][i], expected, 1e-4) << i;
      }
    }
  }
}

TEST(Communicator, DirectAllReduceEqualsTheNaiveReferenceOnRandomFloats) {
  // The direct algorithm reduces each element over ranks in rank order with
  // float32 accumulation for half types: the naive reference, bitwise, even
  // for inexact values and across several window-sized chunks.
  constexpr int kSize = 5;
  constexpr std::size_t kCount = 50021;
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct}) {
      std::vector<std::vector<unsigned char>> inputs(kSize);
      std::vector<const void*> pointers;
      for (int r = 0; r < kSize; ++r) {
        std::mt19937 rng(r + 100);
        std::normal_distribution<float> dist(1.0f, 0.5f);
        std::vector<double> values(kCount);
        for (auto& v : values) v = dist(rng);
        inputs[r].resize(kCount * ElementSize(type));
        for (std::size_t i = 0; i < kCount; ++i) {
          unsigned char* p = inputs[r].data() + i * ElementSize(type);
          const float f = static_cast<float>(values[i]);
          if (type == DataType::kFloat32) std::memcpy(p, &f, 4);
          else if (type == DataType::kBFloat16) { auto h = FloatToBFloat16(f); std::memcpy(p, &h, 2); }
          else { auto h = FloatToHalf(f); std::memcpy(p, &h, 2); }
        }
        pointers.push_back(inputs[r].data());
      }
      std::vector<unsigned char> expected(kCount * ElementSize(type));
      ReduceInputs(type, op, pointers.data(), kSize, expected.data(), kCount, kSize);
      RunRanks(kSize, [&](int rank, Store& store) {
        CommunicatorOptions options;
        options.shm_window_bytes = 64 << 10;  // several chunks
        Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, kSize, options);
        auto data = inputs[rank];
        comm.AllReduce({data.data(), kCount, type, op, Algorithm::kDirect});
        ASSERT_EQ(data, expected) << Name(type) << " " << Name(op) << " rank " << rank;
      });
    }
  }
}

// Rank `rank`'s input for an allreduce, in a registered buffer (freed by
// the caller).
void* RegisteredInput(DataType type, ReduceOp op, int rank, std::size_t count) {
  const auto input = Input(type, op, rank, count);
  void* buffer = transport::SharedBufferPool::Instance().Allocate(input.size());
  EXPECT_NE(buffer, nullptr);
  std::memcpy(buffer, input.data(), input.size());
  return buffer;
}

std::vector<unsigned char> TakeRegistered(void* buffer, DataType type, std::size_t count) {
  const auto* p = static_cast<unsigned char*>(buffer);
  std::vector<unsigned char> out(p, p + count * ElementSize(type));
  transport::SharedBufferPool::Instance().Free(buffer);
  return out;
}

TEST(Communicator, RegisteredDirectAllReduceMatchesTheReference) {
  // Every rank's buffer registered: each rank reduces its slice from all
  // buffers in place and writes it into all of them. Every dtype and op;
  // fewer elements than ranks (empty slices) included. The reduction is
  // the reference's own, in rank order: bitwise equal, averages too.
  for (int size : {2, 3, 5, 8}) {
    RunRanks(size, [&](int rank, Store& store) {
      CommunicatorOptions options;
      options.transport = TransportKind::kShm;
      options.small_message_bytes = 0;  // every size takes the sliced path
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, size, options);
      for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{100003}}) {
        for (DataType type : kTypes) {
          for (ReduceOp op : kOps) {
            if (!Supported(type, op)) continue;
            if (count > 1001 && type != DataType::kFloat32 && type != DataType::kBFloat16) continue;
            void* buffer = RegisteredInput(type, op, rank, count);
            comm.AllReduce({buffer, count, type, op, Algorithm::kDirect});
            const auto out = TakeRegistered(buffer, type, count);
            ASSERT_TRUE(comm.records().back().registered);
            ASSERT_EQ(out, Reference(type, op, size, count))
                << Name(type) << " " << Name(op) << " count " << count << " size " << size
                << " rank " << rank;
          }
        }
      }
    });
  }
}

TEST(Communicator, AnUnregisteredRankMakesEveryRankStage) {
  // Rank 0's buffer is registered, the others' are not: every rank takes
  // the staged path (sizes the handshake stages and sizes it does not),
  // then, all registered, the in-place one; the results are the same.
  constexpr int kSize = 3;
  RunRanks(kSize, [&](int rank, Store& store) {
    CommunicatorOptions options;
    options.transport = TransportKind::kShm;
    options.shm_window_bytes = 64 << 10;
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, kSize, options);
    const DataType type = DataType::kFloat32;
    const ReduceOp op = ReduceOp::kSum;
    for (std::size_t count : {std::size_t{10000}, std::size_t{100003}}) {
      for (bool everyone : {false, true}) {
        const auto expected = Reference(type, op, kSize, count);
        if (rank == 0 || everyone) {
          void* buffer = RegisteredInput(type, op, rank, count);
          comm.AllReduce({buffer, count, type, op});
          ASSERT_EQ(TakeRegistered(buffer, type, count), expected) << count;
        } else {
          auto data = Input(type, op, rank, count);
          comm.AllReduce({data.data(), count, type, op});
          ASSERT_EQ(data, expected) << count;
        }
        EXPECT_EQ(comm.records().back().registered, everyone) << count;
      }
    }
  });
}

TEST_P(CommunicatorSweep, BroadcastAllGatherReduceScatterMatchTheReference) {
  const auto options = Options();
  const DataType types[] = {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64,
                            DataType::kUInt8};
  for (int size : kWorldSizes) {
    References references;  // the full reductions the reduce-scatters split
    for (std::size_t count : kCounts) {
      for (DataType type : types) {
        references[{type, ReduceOp::kMax, count}] =
            Reference(type, ReduceOp::kMax, size, count * size);
      }
    }
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, size, options);
      for (std::size_t count : kCounts) {
        for (DataType type : types) {
          for (int root : {0, size - 1, size / 2}) {
            auto data = Input(type, ReduceOp::kSum, rank, count);
            comm.Broadcast({data.data(), count, type, root});
            ASSERT_EQ(data, Input(type, ReduceOp::kSum, root, count)) << "broadcast root " << root;
          }
          const auto mine = Input(type, ReduceOp::kSum, rank, count);
          for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kBruck}) {
            std::vector<unsigned char> gathered(mine.size() * size);
            comm.AllGather({mine.data(), gathered.data(), count, type, algorithm});
            for (int r = 0; r < size; ++r) {
              const auto theirs = Input(type, ReduceOp::kSum, r, count);
              ASSERT_TRUE(std::equal(theirs.begin(), theirs.end(),
                                     gathered.begin() + r * theirs.size()))
                  << "allgather " << Name(algorithm) << " block " << r;
            }
          }
          // Reduce-scatter of size x count elements: block r of the full
          // reduction lands on rank r.
          const auto input = Input(type, ReduceOp::kMax, rank, count * size);
          std::vector<unsigned char> block(count * ElementSize(type));
          comm.ReduceScatter({input.data(), block.data(), count, type, ReduceOp::kMax});
          const auto& full = references.at({type, ReduceOp::kMax, count});
          ASSERT_TRUE(std::equal(block.begin(), block.end(), full.begin() + rank * block.size()))
              << "reducescatter " << Name(type) << " count " << count;
        }
      }
      comm.Barrier();
    });
  }
}

TEST_P(CommunicatorSweep, MismatchedCallsRaiseNamingOpSequenceAndRanks) {
  const auto options = Options();
  try {
    RunRanks(3, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 3, options);
      comm.Barrier();
      std::vector<float> data(rank == 1 ? 200 : 100);
      comm.AllReduce({data.data(), data.size(), DataType::kFloat32});
    });
    FAIL() << "a size mismatch went unnoticed";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mismatched collectives"), std::string::npos) << what;
    EXPECT_NE(what.find("allreduce #1 of 200 float32 (sum)"), std::string::npos) << what;
    EXPECT_NE(what.find("allreduce #1 of 100 float32 (sum)"), std::string::npos) << what;
  }
  // Different ops at the same point.
  try {
    RunRanks(2, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
      std::vector<float> data(8);
      if (rank == 0) comm.Broadcast({data.data(), 8, DataType::kFloat32, 0});
      else comm.AllReduce({data.data(), 8, DataType::kFloat32});
    });
    FAIL() << "an op mismatch went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast #0 of 8 float32 with root 0"),
              std::string::npos)
        << e.what();
  }
}

// The checks of RootedAllToAllAndUnevenOpsMatchTheReference, each on one
// rank of `size` with `count` elements of `type`.
void CheckRooted(Communicator& comm, int rank, int size, DataType type, std::size_t count,
                 int root) {
  const std::size_t esize = ElementSize(type);
  // reduce: the root gets the reference; the others keep their input.
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
    auto data = Input(type, op, rank, count);
    comm.Reduce({data.data(), count, type, op, root});
    if (rank == root && !InexactAverage(type, op)) {
      ASSERT_EQ(data, Reference(type, op, size, count)) << "reduce " << Name(op);
    }
  }
  // gather / scatter
  const auto mine = Input(type, ReduceOp::kSum, rank, count);
  std::vector<unsigned char> all(count * esize * size);
  comm.Gather({mine.data(), all.data(), count, type, root});
  if (rank == root) {
    for (int r = 0; r < size; ++r) {
      const auto theirs = Input(type, ReduceOp::kSum, r, count);
      ASSERT_TRUE(std::equal(theirs.begin(), theirs.end(), all.begin() + r * theirs.size()));
    }
  }
  const auto source = Input(type, ReduceOp::kSum, root, count * size);
  std::vector<unsigned char> part(count * esize);
  comm.Scatter({rank == root ? source.data() : nullptr, part.data(), count, type, root});
  ASSERT_TRUE(std::equal(part.begin(), part.end(), source.begin() + rank * part.size()));
}

void CheckAllToAll(Communicator& comm, int rank, int size, DataType type, std::size_t count) {
  const std::size_t esize = ElementSize(type);
  // alltoall, equal blocks: block p of rank r's input is Input(r)[p].
  const auto in = Input(type, ReduceOp::kSum, rank, count * size);
  std::vector<unsigned char> out(in.size());
  comm.AllToAll({in.data(), out.data(), count, {}, {}, type});
  for (int p = 0; p < size; ++p) {
    const auto theirs = Input(type, ReduceOp::kSum, p, count * size);
    const std::size_t block = count * esize;
    ASSERT_TRUE(std::equal(out.begin() + p * block, out.begin() + (p + 1) * block,
                           theirs.begin() + rank * block))
        << "alltoall block from " << p;
  }
  // alltoall, per-peer sizes: rank a sends (a + 2b + count) % 4 elements to b.
  auto n_of = [&](int a, int b) { return static_cast<std::size_t>((a + 2 * b + count) % 4); };
  std::vector<std::size_t> sends(size), recvs(size);
  for (int p = 0; p < size; ++p) {
    sends[p] = n_of(rank, p);
    recvs[p] = n_of(p, rank);
  }
  std::size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < size; ++p) send_total += sends[p], recv_total += recvs[p];
  std::vector<unsigned char> vin = Input(type, ReduceOp::kSum, rank, send_total);
  std::vector<unsigned char> vout(recv_total * esize);
  comm.AllToAll({vin.data(), vout.data(), 0, sends, recvs, type});
  std::size_t at = 0;
  for (int p = 0; p < size; ++p) {
    std::size_t offset = 0;  // where p's block for me starts in p's input
    for (int q = 0; q < rank; ++q) offset += n_of(p, q);
    const auto theirs = Input(type, ReduceOp::kSum, p, offset + recvs[p]);
    ASSERT_TRUE(std::equal(vout.begin() + at, vout.begin() + at + recvs[p] * esize,
                           theirs.begin() + offset * esize))
        << "alltoallv block from " << p;
    at += recvs[p] * esize;
  }
}

void CheckUnevenReduceScatter(Communicator& comm, int rank, int size, DataType type,
                              std::size_t count) {
  const std::size_t esize = ElementSize(type);
  // reduce-scatter with uneven blocks: rank r gets (r + count) % 3 elements.
  std::vector<std::size_t> rs_counts(size);
  std::size_t rs_total = 0;
  for (int r = 0; r < size; ++r) rs_total += rs_counts[r] = (r + count) % 3;
  const auto rs_input = Input(type, ReduceOp::kMax, rank, rs_total);
  std::vector<unsigned char> rs_out(rs_counts[rank] * esize);
  comm.ReduceScatter({rs_input.data(), rs_out.data(), 0, type, ReduceOp::kMax, rs_counts});
  const auto rs_full = Reference(type, ReduceOp::kMax, size, rs_total);
  std::size_t rs_at = 0;
  for (int r = 0; r < rank; ++r) rs_at += rs_counts[r];
  ASSERT_TRUE(std::equal(rs_out.begin(), rs_out.end(), rs_full.begin() + rs_at * esize))
      << "uneven reducescatter";
}

void CheckAllGatherV(Communicator& comm, int rank, int size, DataType type, std::size_t count) {
  const std::size_t esize = ElementSize(type);
  // allgatherv: rank r contributes (r + count) % 3 elements.
  std::vector<std::size_t> counts(size);
  std::size_t total = 0;
  for (int r = 0; r < size; ++r) total += counts[r] = (r + count) % 3;
  const auto block = Input(type, ReduceOp::kSum, rank, counts[rank]);
  std::vector<unsigned char> gathered(total * esize);
  comm.AllGatherV({block.data(), gathered.data(), counts, type});
  std::size_t pos = 0;
  for (int r = 0; r < size; ++r) {
    const auto theirs = Input(type, ReduceOp::kSum, r, counts[r]);
    ASSERT_TRUE(std::equal(theirs.begin(), theirs.end(), gathered.begin() + pos));
    pos += theirs.size();
  }
}

TEST_P(CommunicatorSweep, RootedAllToAllAndUnevenOpsMatchTheReference) {
  const auto options = Options();
  for (int size : {1, 2, 3, 5, 8}) {
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, size, options);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
        for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
          // A failed check stops this rank, as an ASSERT in the lambda would.
          for (int root : {0, size - 1}) {
            ASSERT_NO_FATAL_FAILURE(CheckRooted(comm, rank, size, type, count, root));
          }
          ASSERT_NO_FATAL_FAILURE(CheckAllToAll(comm, rank, size, type, count));
          ASSERT_NO_FATAL_FAILURE(CheckUnevenReduceScatter(comm, rank, size, type, count));
          ASSERT_NO_FATAL_FAILURE(CheckAllGatherV(comm, rank, size, type, count));
        }
      }
    });
  }
}

TEST_P(CommunicatorSweep, AllToAllSizeDisagreementIsNamed) {
  const auto options = Options();
  try {
    RunRanks(2, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
      std::vector<float> in(8), out(8);
      // rank 0 sends 3 elements to rank 1, but rank 1 expects 2 from rank 0.
      const std::vector<std::size_t> sends = rank == 0 ? std::vector<std::size_t>{1, 3}
                                                       : std::vector<std::size_t>{2, 1};
      const std::vector<std::size_t> recvs = rank == 0 ? std::vector<std::size_t>{1, 2}
                                                       : std::vector<std::size_t>{2, 1};
      comm.AllToAll({in.data(), out.data(), 0, sends, recvs, DataType::kFloat32});
    });
    FAIL() << "a size disagreement went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 sends 3 elements to rank 1, which expects 2"),
              std::string::npos)
        << e.what();
  }
}

// Mixes of equal and per-peer blocks across ranks, and their mismatches:
// all_to_all_test.cc.

TEST_P(CommunicatorSweep, SplitFormsIndependentGroups) {
  const auto options = Options();
  RunRanks(6, [&](int rank, Store& store) {
    Communicator world(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 6, options);
    // Even and odd ranks, ordered by descending key; rank 5 stays out.
    const int color = rank == 5 ? Communicator::kNoColor : rank % 2;
    auto group = world.Split(color, -rank, options);
    if (rank == 5) {
      EXPECT_EQ(group, nullptr);
      world.Barrier();
      return;
    }
    ASSERT_NE(group, nullptr);
    const std::vector<int> evens = {4, 2, 0}, odds = {3, 1};
    const auto& members = rank % 2 == 0 ? evens : odds;
    EXPECT_EQ(group->size(), static_cast<int>(members.size()));
    EXPECT_EQ(members[group->rank()], rank);
    std::vector<std::int64_t> value = {rank};
    group->AllReduce({value.data(), 1, DataType::kInt64});
    EXPECT_EQ(value[0], rank % 2 == 0 ? 6 : 4);
    // The world communicator still works alongside its groups.
    world.Barrier();
    // Members keep their place on the fabric: same simulated clock.
    EXPECT_EQ(&group->clock(), &world.clock());
  });
}

TEST_P(CommunicatorSweep, DifferentAlgorithmsAreAMismatch) {
  const auto options = Options();
  try {
    RunRanks(2, [&](int rank, Store& store) {
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
      std::vector<float> data(64);
      comm.AllReduce({data.data(), 64, DataType::kFloat32, ReduceOp::kSum,
                      rank == 0 ? Algorithm::kRing : Algorithm::kRecursiveDoubling});
    });
    FAIL() << "ranks ran different algorithms unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("by ring"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("by recursive_doubling"), std::string::npos) << e.what();
  }
}

// Ranks whose options send a small allreduce different ways (in the header
// line or the header slots, staged in the windows) are told, not left to
// read stale data.
TEST(Communicator, RanksThatWouldMoveASmallAllreduceDifferentlyAreAMismatch) {
  // 2 floats travel in the header's line, 16 in the header slot.
  for (const auto& [count, path] : {std::pair<std::size_t, std::string>{2, "(in the header line)"},
                                    {16, "(in the header slots)"}}) {
    try {
      RunRanks(2, [&](int rank, Store& store) {
        CommunicatorOptions options;
        options.transport = TransportKind::kShm;
        options.small_message_bytes = rank == 0 ? (16u << 10) : 0;  // rank 1: never small
        Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
        std::vector<float> data(count, 1.0f);
        comm.AllReduce({data.data(), count, DataType::kFloat32, ReduceOp::kSum});
      });
      ADD_FAILURE() << "ranks moved " << count << " floats differently unnoticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST_P(CommunicatorSweep, PointToPointKeepsOrderTagsAndSources) {
  const auto options = Options();
  RunRanks(4, [&](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 4, options);
    if (rank == 0) {
      // In order on one tag, then tag 8 before tag 7, then a large message.
      for (int i = 0; i < 3; ++i) comm.Send(1, &i, sizeof(i), 1);
      const int seven = 7, eight = 8;
      comm.Send(1, &seven, sizeof(seven), 7);
      comm.Send(1, &eight, sizeof(eight), 8);
      std::vector<char> big(8 << 20, 'x');
      comm.Send(1, big.data(), big.size(), 2);
    } else if (rank == 1) {
      for (int i = 0; i < 3; ++i) {
        int got = -1;
        EXPECT_EQ(comm.Recv(0, &got, sizeof(got), 1), 0);
        EXPECT_EQ(got, i);
      }
      int got = 0;
      comm.Recv(0, &got, sizeof(got), 8);
      EXPECT_EQ(got, 8);
      comm.Recv(0, &got, sizeof(got), 7);
      EXPECT_EQ(got, 7);
      std::vector<char> big(8 << 20);
      comm.Recv(0, big.data(), big.size(), 2);
      EXPECT_EQ(big[12345], 'x');
    }
    // Collectives and point-to-point do not share a stream.
    if (rank == 3) comm.Send(2, &rank, sizeof(rank), 9);
    std::vector<float> data(100, 1.0f);
    comm.AllReduce({data.data(), data.size(), DataType::kFloat32});
    EXPECT_EQ(data[0], 4.0f);
    if (rank == 2) {
      int got = -1;
      EXPECT_EQ(comm.Recv(3, &got, sizeof(got), 9), 3);
      EXPECT_EQ(got, 3);
    }
    // Receive from any source.
    if (rank != 0) {
      comm.Send(0, &rank, sizeof(rank), 5);
    } else {
      std::set<int> sources;
      for (int i = 0; i < 3; ++i) {
        int got = -1;
        const int source = comm.Recv(Communicator::kAnySource, &got, sizeof(got), 5);
        EXPECT_EQ(got, source);
        sources.insert(source);
      }
      EXPECT_EQ(sources, (std::set<int>{1, 2, 3}));
    }
    comm.Barrier();
  });
}

// A receive from any rank leaves header receives posted for the ranks that
// did not match; one may land while a later receive takes an earlier,
// stashed message from the same rank. Both messages keep their own header.
TEST_P(CommunicatorSweep, AStashedMessageDoesNotDisturbAHeaderStillLanding) {
  const auto options = Options();
  RunRanks(3, [&](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 3, options);
    auto send = [&](int to, int value, std::uint64_t tag) {
      comm.Send(to, &value, sizeof(value), tag);
    };
    auto recv = [&](int from, std::uint64_t tag) {
      int value = -1;
      EXPECT_EQ(comm.Recv(from, &value, sizeof(value), tag),
                from == Communicator::kAnySource ? 1 : from);
      return value;
    };
    if (rank == 2) {
      send(0, 60, 6);
      send(0, 70, 7);
      recv(0, 1);      // rank 0 is in its receive from any rank
      send(0, 80, 8);  // lands in the header receive left posted for rank 2
      send(1, 0, 99);
    } else if (rank == 1) {
      recv(0, 1);
      send(0, 50, 5);
      recv(2, 99);  // rank 2's tag 8 has left
      send(0, 90, 9);
    } else {
      EXPECT_EQ(recv(2, 7), 70);  // stashes tag 6
      send(1, 0, 1);
      send(2, 0, 1);
      EXPECT_EQ(recv(Communicator::kAnySource, 5), 50);
      EXPECT_EQ(recv(1, 9), 90);  // by now rank 2's tag 8 header has landed
      EXPECT_EQ(recv(2, 6), 60);  // from the stash
      EXPECT_EQ(recv(2, 8), 80);
    }
    comm.Barrier();
  });
}

TEST_P(CommunicatorSweep, PointToPointSizeMismatchNamesBothSizes) {
  const auto options = Options();
  RunRanks(2, [&](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
    if (rank == 0) {
      const double eight_bytes = 1.0;
      comm.Send(1, &eight_bytes, sizeof(eight_bytes), 3);
    } else {
      float four_bytes;
      try {
        comm.Recv(0, &four_bytes, sizeof(four_bytes), 3);
        FAIL() << "a size mismatch went unnoticed";
      } catch (const InvalidUsage& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0 sent 8 bytes but the receive expects 4"),
                  std::string::npos)
            << e.what();
      }
    }
  });
}

TEST(Communicator, ReceiveCompletesAtSendTimePlusTransfer) {
  RunRanks(2, [](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2);
    std::vector<char> buffer(1 << 20);
    if (rank == 0) {
      comm.clock().AdvanceCompute(runtime::SimDuration(100));
      comm.Send(1, buffer.data(), buffer.size());
    } else {
      comm.Recv(0, buffer.data(), buffer.size());
      const runtime::Schedule transfer = runtime::PointToPointSchedule(0, 1, double(1 << 20));
      const double modelled = comm.fabric().Simulate(transfer).total.count();
      EXPECT_DOUBLE_EQ(comm.clock().compute().count(), 100.0 + modelled);
    }
  });
}

TEST(Communicator, BadArgumentsAreInvalidUsage) {
  HashStore store;
  EXPECT_THROW(Communicator(std::shared_ptr<Store>(&store, [](Store*) {}), 1, 1), InvalidUsage);
  Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), 0, 1);
  float x = 1;
  EXPECT_THROW(comm.Broadcast({&x, 1, DataType::kFloat32, 3}), InvalidUsage);
  EXPECT_THROW(comm.AllReduce({&x, 1, DataType::kFloat32, ReduceOp::kBxor}), InvalidUsage);
  EXPECT_THROW(ParseAlgorithm("fastest"), InvalidUsage);
  EXPECT_THROW(comm.Gather({&x, &x, 1, DataType::kFloat32, 1}), InvalidUsage);
  EXPECT_THROW(comm.AllGatherV({&x, &x, {1, 1}, DataType::kFloat32}), InvalidUsage);
  EXPECT_THROW(comm.Send(0, &x, sizeof(x)), InvalidUsage);  // to itself
  EXPECT_THROW(comm.Recv(4, &x, sizeof(x)), InvalidUsage);
}

TEST(Communicator, MissingRankTimesOutNamingIt) {
  try {
    RunRanks(2, [](int rank, Store& store) {
      CommunicatorOptions options;
      options.timeout = 300ms;
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2, options);
      if (rank == 0) comm.Barrier();  // rank 1 never calls it
    });
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("barrier #0 on rank 0 timed out; still pending: "
                                         "ranks that have not arrived: 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace neuron::collectives

namespace neuron::collectives {
namespace {

// Rank `rank` of a group whose rank r runs on simulated host host_of[r].
Communicator OnHost(Store& store, int rank, const std::vector<int>& host_of) {
  CommunicatorOptions options;
  options.host = "host" + std::to_string(host_of[rank]);
  options.tcp_address = "127.0.0.1";
  return Communicator(std::shared_ptr<Store>(&store, [](Store*) {}), rank,
                      static_cast<int>(host_of.size()), options);
}

// Ranks on several (simulated) hosts: within a host shared memory, across
// TCP, and the hierarchical allreduce chosen by default. Layouts: ranks per
// host, hosts in rank order.
TEST(Communicator, HierarchicalAllReduceAcrossHostsMatchesTheReference) {
  const std::vector<std::vector<int>> layouts = {{2, 2}, {3, 2}, {1, 3}, {2, 2, 2}};
  for (const auto& layout : layouts) {
    std::vector<int> host_of;
    for (std::size_t h = 0; h < layout.size(); ++h) host_of.insert(host_of.end(), layout[h], h);
    const int size = static_cast<int>(host_of.size());
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm = OnHost(store, rank, host_of);
      EXPECT_STREQ(comm.transport_name(), "tcp");
      EXPECT_TRUE(comm.hierarchical());
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
        for (DataType type : kTypes) {
          for (ReduceOp op : kOps) {
            if (!Supported(type, op)) continue;
            auto data = Input(type, op, rank, count);
            comm.AllReduce({data.data(), count, type, op});
            if (InexactAverage(type, op)) continue;
            ASSERT_EQ(data, Reference(type, op, size, count))
                << "hierarchical " << Name(type) << " " << Name(op) << " count " << count
                << " layout of " << size << " ranks, rank " << rank;
          }
        }
      }
      EXPECT_EQ(comm.records().back().op, "allreduce");
      // Asking for it where it does not apply is an error naming the algorithm.
      if (layout == std::vector<int>{2, 2}) {
        std::vector<float> one(4, 1.0f);
        comm.AllReduce({one.data(), 4, DataType::kFloat32, ReduceOp::kSum,
                        Algorithm::kHierarchical});
        EXPECT_EQ(one[3], 4.0f);
      }
    });
  }
  // A single host has no hierarchy to use.
  RunRanks(2, [](int rank, Store& store) {
    Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 2);
    EXPECT_FALSE(comm.hierarchical());
    float x = 1;
    EXPECT_THROW(comm.AllReduce({&x, 1, DataType::kFloat32, ReduceOp::kSum,
                                 Algorithm::kHierarchical}),
                 InvalidUsage);
  });
}

}  // namespace
}  // namespace neuron::collectives

namespace neuron::collectives {
namespace {

// Broadcast and allgather across (simulated) hosts take the hierarchical
// path, hosts holding consecutive ranks or not.
TEST(Communicator, HierarchicalBroadcastAndAllGatherMatchTheReference) {
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1, 1}, {0, 1, 1, 2, 2, 2}};
  for (const auto& host_of : layouts) {
    const int size = static_cast<int>(host_of.size());
    RunRanks(size, [&](int rank, Store& store) {
      Communicator comm = OnHost(store, rank, host_of);
      ASSERT_TRUE(comm.hierarchical());
      auto value = [](int r, std::size_t i) { return static_cast<std::int64_t>(r * 100000 + i); };
      for (std::size_t count : {std::size_t{1}, std::size_t{1001}}) {
        for (int root = 0; root < size; ++root) {
          std::vector<std::int64_t> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = rank == root ? value(root, i) : -1;
          comm.Broadcast({data.data(), count, DataType::kInt64, root});
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(data[i], value(root, i)) << "broadcast from " << root << " to " << rank;
          }
        }
        std::vector<std::int64_t> mine(count), all(count * size, -1);
        for (std::size_t i = 0; i < count; ++i) mine[i] = value(rank, i);
        comm.AllGather({mine.data(), all.data(), count, DataType::kInt64});
        for (int r = 0; r < size; ++r) {
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(all[r * count + i], value(r, i)) << "allgather block " << r << " on "
                                                       << rank;
          }
        }
      }
      EXPECT_EQ(comm.records().back().op, "allgather");
    });
  }
}

// Uneven block sizes that differ across ranks (equal totals) are caught by
// the header's fingerprint; with NEURON_CC_DEBUG=1 on TCP every rank sees
// every header and names all the ranks that differ.
TEST(Communicator, BlockSizesAndDebugFingerprintsCatchWhatTotalsHide) {
  for (const bool debug : {false, true}) {
    if (debug) ::setenv("NEURON_CC_DEBUG", "1", 1);
    std::vector<std::string> errors(4);
    RunRanks(4, [&](int rank, Store& store) {
      CommunicatorOptions options;
      options.transport = TransportKind::kTcp;
      Communicator comm(std::shared_ptr<Store>(&store, [](Store*) {}), rank, 4, options);
      // Ranks 2 and 3 swap two blocks: same total, different layout.
      std::vector<std::size_t> counts = {1, 2, 3, 4};
      if (rank >= 2) std::swap(counts[0], counts[1]);
      std::vector<float> in(counts[rank], 1.0f), out(10);
      try {
        comm.AllGatherV({in.data(), out.data(), counts, DataType::kFloat32});
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
    ::unsetenv("NEURON_CC_DEBUG");
    int naming_both = 0;
    for (const auto& e : errors) {
      EXPECT_FALSE(e.empty());
      if (e.find("mismatched collectives") == std::string::npos) continue;
      EXPECT_NE(e.find("allgatherv #0 of 10 float32 (block sizes "), std::string::npos) << e;
      if (e.find("NEURON_CC_DEBUG: ranks differing from rank 0: 2, 3") != std::string::npos ||
          e.find("NEURON_CC_DEBUG: ranks differing from rank 1: 2, 3") != std::string::npos) {
        ++naming_both;
      }
    }
    if (debug) {
      EXPECT_GE(naming_both, 1);
    }
  }
}

}  // namespace
}  // namespace neuron::collectives
