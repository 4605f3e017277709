// The host algorithms built on point-to-point exchanges (any transport):
// ring reduce-scatter, allgather and allreduce, recursive doubling, Rabenseifner's
// allreduce and Bruck's allgather, each citing its source.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms.h"
#include "wire.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives {

using detail::Begin;
using detail::Mod;

// Ring reduce-scatter (Patarasuk & Yuan, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations", 2009): after n-1 steps rank r
// holds chunk r (elements [chunks[r], chunks[r+1])) reduced over all ranks,
// accumulated in ring order.
void RingReduceScatter(GroupContext& g, char* data,
                       const std::vector<std::size_t>& chunks, DataType dtype,
                       ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank + 1, size), left = Mod(rank - 1, size);
  std::size_t largest = 0;
  for (int c = 0; c < size; ++c) largest = std::max(largest, chunks[c + 1] - chunks[c]);
  g.scratch().resize(largest * esize);
  for (int k = 0; k < size - 1; ++k) {
    const int send_chunk = Mod(rank - k - 1, size);
    const int recv_chunk = Mod(rank - k - 2, size);
    const std::size_t sb = chunks[send_chunk], rb = chunks[recv_chunk];
    const std::size_t rn = chunks[recv_chunk + 1] - rb;
    g.Exchange(right, data + sb * esize, (chunks[send_chunk + 1] - sb) * esize, left,
               g.scratch().data(), rn * esize, what);
    Accumulate(dtype, op, data + rb * esize, g.scratch().data(), rn);
  }
}

// Ring allgather: rank r starts owning chunk r; in n-1 steps each chunk
// travels once around the ring.
void RingAllGather(GroupContext& g, char* data, std::size_t count, DataType dtype,
                   const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank + 1, size), left = Mod(rank - 1, size);
  for (int k = 0; k < size - 1; ++k) {
    const int send_chunk = Mod(rank - k, size);
    const int recv_chunk = Mod(rank - k - 1, size);
    const std::size_t sb = Begin(count, size, send_chunk);
    const std::size_t rb = Begin(count, size, recv_chunk);
    g.Exchange(right, data + sb * esize,
               (Begin(count, size, send_chunk + 1) - sb) * esize, left, data + rb * esize,
               (Begin(count, size, recv_chunk + 1) - rb) * esize, what);
  }
}

void RingAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                   ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  std::vector<std::size_t> chunks(size + 1);
  for (int c = 0; c <= size; ++c) chunks[c] = Begin(count, size, c);
  RingReduceScatter(g, data, chunks, dtype, op, what);
  if (op == ReduceOp::kAvg) {
    FinishAverage(dtype, data + chunks[rank] * ElementSize(dtype),
                  chunks[rank + 1] - chunks[rank], static_cast<std::size_t>(size));
  }
  RingAllGather(g, data, count, dtype, what);
}

void RingReduceScatterInto(GroupContext& g, const char* input, char* output,
                           const std::vector<std::size_t>& chunks, DataType dtype,
                           ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype);
  std::vector<char> work(input, input + chunks.back() * esize);
  if (size > 1) RingReduceScatter(g, work.data(), chunks, dtype, op, what);
  const std::size_t mine = chunks[rank + 1] - chunks[rank];
  char* block = work.data() + chunks[rank] * esize;
  if (op == ReduceOp::kAvg && mine > 0) {
    FinishAverage(dtype, block, mine, static_cast<std::size_t>(size));
  }
  if (mine > 0) std::memcpy(output, block, mine * esize);
}

namespace {

// The ranks beyond the largest power of two p of the power-of-two
// allreduces: rank p + i hands its data to rank i, which reduces it in
// (rank i's data first), and waits for the result. Returns p, or 0 on the
// ranks folded in (their data then holds the result).
int FoldExtraRanks(GroupContext& g, char* data, std::size_t count, DataType dtype,
                   ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t bytes = count * ElementSize(dtype);
  int p = 1;
  while (p * 2 <= size) p *= 2;
  g.scratch().resize(bytes);
  if (rank >= p) {
    g.transport().Wait({g.transport().Isend(rank - p, data, bytes)}, g.NewDeadline(),
                       what);
    g.transport().Wait({g.transport().Irecv(rank - p, data, bytes)}, g.NewDeadline(),
                       what);
    return 0;
  }
  if (rank < size - p) {
    g.transport().Wait({g.transport().Irecv(rank + p, g.scratch().data(), bytes)},
                       g.NewDeadline(), what);
    Accumulate(dtype, op, data, g.scratch().data(), count);
  }
  return p;
}

// After the power-of-two algorithm: rank i sends the result to rank p + i.
void ServeExtraRanks(GroupContext& g, const char* data, std::size_t bytes, int p,
                     const Label& what) {
  const int rank = g.rank(), size = g.size();
  if (rank < size - p) {
    g.transport().Wait({g.transport().Isend(rank + p, data, bytes)}, g.NewDeadline(),
                       what);
  }
}

}  // namespace

// Recursive doubling (Thakur, Rabenseifner & Gropp, "Optimization of
// collective communication operations in MPICH", 2005), with the ranks
// beyond the largest power of two folded in first and served last. Each
// exchange combines the lower-ranked half first, so all ranks compute the
// same expression tree and get bitwise the same result.
void RecursiveDoublingAllReduce(GroupContext& g, char* data, std::size_t count,
                                DataType dtype, ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t bytes = count * ElementSize(dtype);
  const int p = FoldExtraRanks(g, data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank ^ d;
    g.Exchange(partner, data, bytes, partner, g.scratch().data(), bytes, what);
    if (partner < rank) {  // theirs op mine, computed in scratch
      Accumulate(dtype, op, g.scratch().data(), data, count);
      std::memcpy(data, g.scratch().data(), bytes);
    } else {
      Accumulate(dtype, op, data, g.scratch().data(), count);
    }
  }
  if (op == ReduceOp::kAvg)
    FinishAverage(dtype, data, count, static_cast<std::size_t>(size));
  ServeExtraRanks(g, data, bytes, p, what);
}

// Rabenseifner's allreduce (Rabenseifner, "Optimization of collective
// reduction operations", 2004; as in Thakur, Rabenseifner & Gropp 2005):
// recursive halving reduce-scatter, then recursive doubling allgather, over
// the largest power of two of ranks (the others folded in first and served
// last). Each exchange combines the lower-ranked side first.
void RabenseifnerAllReduce(GroupContext& g, char* data, std::size_t count, DataType dtype,
                           ReduceOp op, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = ElementSize(dtype), bytes = count * esize;
  const int p = FoldExtraRanks(g, data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  // Halving: keep the half on my side of the partner, reduce it, pass on the other.
  std::size_t lo = 0, hi = count;
  std::vector<std::pair<std::size_t, std::size_t>> kept;  // segment before each step
  for (int d = p / 2; d >= 1; d /= 2) {
    const int partner = rank ^ d;
    const std::size_t mid = lo + (hi - lo) / 2;
    const bool lower = (rank & d) == 0;
    const std::size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const std::size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    kept.emplace_back(lo, hi);
    g.Exchange(partner, data + give_lo * esize, (give_hi - give_lo) * esize, partner,
               g.scratch().data(), (keep_hi - keep_lo) * esize, what);
    char* mine = data + keep_lo * esize;
    if (partner < rank) {  // theirs op mine
      Accumulate(dtype, op, g.scratch().data(), mine, keep_hi - keep_lo);
      std::memcpy(mine, g.scratch().data(), (keep_hi - keep_lo) * esize);
    } else {
      Accumulate(dtype, op, mine, g.scratch().data(), keep_hi - keep_lo);
    }
    lo = keep_lo;
    hi = keep_hi;
  }
  if (op == ReduceOp::kAvg && hi > lo) {
    FinishAverage(dtype, data + lo * esize, hi - lo, static_cast<std::size_t>(size));
  }
  // Doubling: give my segment, take the partner's, in the reverse order.
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank ^ d;
    const auto [seg_lo, seg_hi] = kept.back();
    kept.pop_back();
    const std::size_t mid = seg_lo + (seg_hi - seg_lo) / 2;
    const bool lower = (rank & d) == 0;
    const std::size_t their_lo = lower ? mid : seg_lo, their_hi = lower ? seg_hi : mid;
    g.Exchange(partner, data + lo * esize, (hi - lo) * esize, partner,
               data + their_lo * esize, (their_hi - their_lo) * esize, what);
    lo = seg_lo;
    hi = seg_hi;
  }
  ServeExtraRanks(g, data, bytes, p, what);
}

// Bruck's allgather (Bruck et al., "Efficient algorithms for all-to-all
// communications in multiport message-passing systems", 1997): ceil(log2 n)
// steps; in step k rank r sends what it holds to r - 2^k and appends what
// r + 2^k holds; a final rotation puts the blocks in rank order.
void BruckAllGather(GroupContext& g, char* out, const void* in, std::size_t block,
                    const Label& what) {
  const int rank = g.rank(), size = g.size();
  std::vector<char> held(block * size);
  std::memcpy(held.data(), in, block);
  for (int k = 1; k < size; k *= 2) {
    const int blocks = std::min(k, size - k);
    g.Exchange(Mod(rank - k, size), held.data(), blocks * block, Mod(rank + k, size),
               held.data() + k * block, blocks * block, what);
  }
  for (int i = 0; i < size; ++i) {  // held[i] is rank r + i's block
    std::memcpy(out + Mod(rank + i, size) * block, held.data() + i * block, block);
  }
}

}  // namespace neuron::collectives
