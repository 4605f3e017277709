// All-to-all, allgather of uneven blocks and the barrier: every rank
// exchanges with every other, in steps that pair the ranks.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms.h"
#include "wire.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::Mod;

namespace {

// Ends the collective on every rank of the group (so none waits for this
// one) with `message`, and throws it here.
[[noreturn]] void Disagree(GroupContext& g, const std::string& message) {
  g.transport().Abort(message);
  throw InvalidUsage(message);
}

}  // namespace

// Pairwise exchange (as in MPICH's alltoall for large messages): in step k
// rank r sends to r + k and receives from r - k, so every pair meets once.
// With per-peer sizes, each step first exchanges the element count, checked
// against what the receiver expects, so a disagreement is an error naming
// both ranks (and aborts the group) rather than a corrupted stream.
void PairwiseAllToAll(GroupContext& g, const char* in, char* out, const BlockLayout& send,
                      const BlockLayout& recv, bool check_counts, const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = send.element_bytes;
  if (send.counts[rank] != recv.counts[rank]) {
    Disagree(g, StrCat(what, ": rank ", rank, " sends ", send.counts[rank],
                       " elements to itself but expects ", recv.counts[rank]));
  }
  if (send.counts[rank] > 0) {
    std::memmove(out + recv.offsets[rank], in + send.offsets[rank],
                 send.counts[rank] * esize);
  }
  for (int k = 1; k < size; ++k) {
    const int to = Mod(rank + k, size), from = Mod(rank - k, size);
    if (check_counts) {
      std::uint64_t sending = send.counts[to], coming = 0;
      g.Exchange(to, &sending, sizeof(sending), from, &coming, sizeof(coming), what);
      if (coming != recv.counts[from]) {
        Disagree(g, StrCat(what, ": rank ", from, " sends ", coming, " elements to rank ",
                           rank, ", which expects ", recv.counts[from]));
      }
    }
    g.Exchange(to, in + send.offsets[to], send.counts[to] * esize, from,
               out + recv.offsets[from], recv.counts[from] * esize, what);
  }
}

// Ring over blocks of different sizes: in step k rank r passes on the
// block of rank r - k and receives that of rank r - k - 1.
void RingAllGatherV(GroupContext& g, const void* in, char* out, const BlockLayout& blocks,
                    const Label& what) {
  const int rank = g.rank(), size = g.size();
  const std::size_t esize = blocks.element_bytes;
  if (blocks.counts[rank] > 0) {
    std::memmove(out + blocks.offsets[rank], in, blocks.counts[rank] * esize);
  }
  const int right = Mod(rank + 1, size), left = Mod(rank - 1, size);
  for (int k = 0; k < size - 1; ++k) {
    const int send_block = Mod(rank - k, size), recv_block = Mod(rank - k - 1, size);
    g.Exchange(right, out + blocks.offsets[send_block], blocks.counts[send_block] * esize,
               left, out + blocks.offsets[recv_block], blocks.counts[recv_block] * esize,
               what);
  }
}

// Dissemination barrier (Hensgen, Finkel & Manber, "Two algorithms for
// barrier synchronization", 1988): ceil(log2 n) rounds of one byte.
void DisseminationBarrier(GroupContext& g, const Label& what) {
  const int rank = g.rank(), size = g.size();
  char out = 1, in = 0;
  for (int k = 1; k < size; k *= 2) {
    g.Exchange(Mod(rank + k, size), &out, 1, Mod(rank - k, size), &in, 1, what);
  }
}

}  // namespace neuron::collectives
