// The host algorithms built on point-to-point exchanges (any transport):
// ring reduce-scatter and allgather, recursive doubling, Rabenseifner's
// allreduce and Bruck's allgather, each citing its source.
#include <algorithm>
#include <cstring>
#include <vector>

#include "communicator_internal.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/reduce.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives {

using detail::Begin;
using detail::Mod;

// Ring reduce-scatter (Patarasuk & Yuan, "Bandwidth optimal all-reduce
// algorithms for clusters of workstations", 2009): after n-1 steps rank r
// holds chunk r (elements [chunks[r], chunks[r+1])) reduced over all ranks,
// accumulated in ring order.
void Communicator::RingReduceScatter(char* data, const std::vector<std::size_t>& chunks,
                                     DataType dtype, ReduceOp op, const Label& what) {
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  std::size_t largest = 0;
  for (int c = 0; c < size_; ++c) largest = std::max(largest, chunks[c + 1] - chunks[c]);
  scratch_.resize(largest * esize);
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_chunk = Mod(rank_ - k - 1, size_);
    const int recv_chunk = Mod(rank_ - k - 2, size_);
    const std::size_t sb = chunks[send_chunk], rb = chunks[recv_chunk];
    const std::size_t rn = chunks[recv_chunk + 1] - rb;
    Exchange(right, data + sb * esize, (chunks[send_chunk + 1] - sb) * esize, left,
             scratch_.data(), rn * esize, what);
    Accumulate(dtype, op, data + rb * esize, scratch_.data(), rn);
  }
}

// Ring allgather: rank r starts owning chunk r; in n-1 steps each chunk
// travels once around the ring.
void Communicator::RingAllGather(char* data, std::size_t count, DataType dtype,
                                 const Label& what) {
  const std::size_t esize = ElementSize(dtype);
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_chunk = Mod(rank_ - k, size_);
    const int recv_chunk = Mod(rank_ - k - 1, size_);
    const std::size_t sb = Begin(count, size_, send_chunk);
    const std::size_t rb = Begin(count, size_, recv_chunk);
    Exchange(right, data + sb * esize, (Begin(count, size_, send_chunk + 1) - sb) * esize,
             left, data + rb * esize, (Begin(count, size_, recv_chunk + 1) - rb) * esize,
             what);
  }
}

// The ranks beyond the largest power of two p of the power-of-two
// allreduces: rank p + i hands its data to rank i, which reduces it in
// (rank i's data first), and waits for the result. Returns p, or 0 on the
// ranks folded in (their data then holds the result).
int Communicator::FoldExtraRanks(char* data, std::size_t count, DataType dtype, ReduceOp op,
                                 const Label& what) {
  const std::size_t bytes = count * ElementSize(dtype);
  int p = 1;
  while (p * 2 <= size_) p *= 2;
  scratch_.resize(bytes);
  if (rank_ >= p) {
    transport_->Wait({transport_->Isend(rank_ - p, data, bytes)}, NewDeadline(), what);
    transport_->Wait({transport_->Irecv(rank_ - p, data, bytes)}, NewDeadline(), what);
    return 0;
  }
  if (rank_ < size_ - p) {
    transport_->Wait({transport_->Irecv(rank_ + p, scratch_.data(), bytes)}, NewDeadline(), what);
    Accumulate(dtype, op, data, scratch_.data(), count);
  }
  return p;
}

// After the power-of-two algorithm: rank i sends the result to rank p + i.
void Communicator::ServeExtraRanks(const char* data, std::size_t bytes, int p,
                                   const Label& what) {
  if (rank_ < size_ - p) {
    transport_->Wait({transport_->Isend(rank_ + p, data, bytes)}, NewDeadline(), what);
  }
}

// Recursive doubling (Thakur, Rabenseifner & Gropp, "Optimization of
// collective communication operations in MPICH", 2005), with the ranks
// beyond the largest power of two folded in first and served last. Each
// exchange combines the lower-ranked half first, so all ranks compute the
// same expression tree and get bitwise the same result.
void Communicator::RecursiveDoublingAllReduce(char* data, std::size_t count, DataType dtype,
                                              ReduceOp op, const Label& what) {
  const std::size_t bytes = count * ElementSize(dtype);
  const int p = FoldExtraRanks(data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank_ ^ d;
    Exchange(partner, data, bytes, partner, scratch_.data(), bytes, what);
    if (partner < rank_) {  // theirs op mine, computed in scratch
      Accumulate(dtype, op, scratch_.data(), data, count);
      std::memcpy(data, scratch_.data(), bytes);
    } else {
      Accumulate(dtype, op, data, scratch_.data(), count);
    }
  }
  if (op == ReduceOp::kAvg) FinishAverage(dtype, data, count, static_cast<std::size_t>(size_));
  ServeExtraRanks(data, bytes, p, what);
}

// Rabenseifner's allreduce (Rabenseifner, "Optimization of collective
// reduction operations", 2004; as in Thakur, Rabenseifner & Gropp 2005):
// recursive halving reduce-scatter, then recursive doubling allgather, over
// the largest power of two of ranks (the others folded in first and served
// last). Each exchange combines the lower-ranked side first.
void Communicator::RabenseifnerAllReduce(char* data, std::size_t count, DataType dtype,
                                         ReduceOp op, const Label& what) {
  const std::size_t esize = ElementSize(dtype), bytes = count * esize;
  const int p = FoldExtraRanks(data, count, dtype, op, what);
  if (p == 0) return;  // folded in: the result came back
  // Halving: keep the half on my side of the partner, reduce it, pass on the other.
  std::size_t lo = 0, hi = count;
  std::vector<std::pair<std::size_t, std::size_t>> kept;  // segment before each step
  for (int d = p / 2; d >= 1; d /= 2) {
    const int partner = rank_ ^ d;
    const std::size_t mid = lo + (hi - lo) / 2;
    const bool lower = (rank_ & d) == 0;
    const std::size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
    const std::size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
    kept.emplace_back(lo, hi);
    Exchange(partner, data + give_lo * esize, (give_hi - give_lo) * esize, partner,
             scratch_.data(), (keep_hi - keep_lo) * esize, what);
    char* mine = data + keep_lo * esize;
    if (partner < rank_) {  // theirs op mine
      Accumulate(dtype, op, scratch_.data(), mine, keep_hi - keep_lo);
      std::memcpy(mine, scratch_.data(), (keep_hi - keep_lo) * esize);
    } else {
      Accumulate(dtype, op, mine, scratch_.data(), keep_hi - keep_lo);
    }
    lo = keep_lo;
    hi = keep_hi;
  }
  if (op == ReduceOp::kAvg && hi > lo) {
    FinishAverage(dtype, data + lo * esize, hi - lo, static_cast<std::size_t>(size_));
  }
  // Doubling: give my segment, take the partner's, in the reverse order.
  for (int d = 1; d < p; d *= 2) {
    const int partner = rank_ ^ d;
    const auto [seg_lo, seg_hi] = kept.back();
    kept.pop_back();
    const std::size_t mid = seg_lo + (seg_hi - seg_lo) / 2;
    const bool lower = (rank_ & d) == 0;
    const std::size_t their_lo = lower ? mid : seg_lo, their_hi = lower ? seg_hi : mid;
    Exchange(partner, data + lo * esize, (hi - lo) * esize, partner, data + their_lo * esize,
             (their_hi - their_lo) * esize, what);
    lo = seg_lo;
    hi = seg_hi;
  }
  ServeExtraRanks(data, bytes, p, what);
}

// Bruck's allgather (Bruck et al., "Efficient algorithms for all-to-all
// communications in multiport message-passing systems", 1997): ceil(log2 n)
// steps; in step k rank r sends what it holds to r - 2^k and appends what
// r + 2^k holds; a final rotation puts the blocks in rank order.
void Communicator::BruckAllGather(char* out, const void* in, std::size_t block,
                                  const Label& what) {
  std::vector<char> held(block * size_);
  std::memcpy(held.data(), in, block);
  for (int k = 1; k < size_; k *= 2) {
    const int blocks = std::min(k, size_ - k);
    Exchange(Mod(rank_ - k, size_), held.data(), blocks * block, Mod(rank_ + k, size_),
             held.data() + k * block, blocks * block, what);
  }
  for (int i = 0; i < size_; ++i) {  // held[i] is rank r + i's block
    std::memcpy(out + Mod(rank_ + i, size_) * block, held.data() + i * block, block);
  }
}

}  // namespace neuron::collectives
