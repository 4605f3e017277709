// All-to-all (equal or per-peer sizes) and allgather with uneven blocks.
#include <cstring>
#include <limits>
#include <numeric>

#include "communicator_internal.h"
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/transport/transport.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::Mod;
using detail::OpCode;

namespace {

std::vector<std::size_t> Offsets(const std::vector<std::size_t>& counts,
                                 std::size_t esize) {
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t i = 0; i < counts.size(); ++i)
    offsets[i + 1] = offsets[i] + counts[i] * esize;
  return offsets;
}

}  // namespace

// Pairwise exchange (as in MPICH's alltoall for large messages): in step k
// rank r sends to r + k and receives from r - k, so every pair meets once.
// With per-peer sizes, each step first exchanges the element count, checked
// against what the receiver expects, so a disagreement is an error naming
// both ranks rather than a corrupted stream.
void Communicator::AllToAll(const AllToAllOptions& o) {
  const bool per_peer = !o.send_counts.empty() || !o.recv_counts.empty();
  NEURON_CHECK(!per_peer || (o.send_counts.size() == static_cast<std::size_t>(size_) &&
                             o.recv_counts.size() == static_cast<std::size_t>(size_)),
               "alltoall: send_counts and recv_counts need one entry per rank (", size_,
               ")");
  const std::size_t esize = ElementSize(o.dtype);
  const std::vector<std::size_t> send_counts =
      per_peer ? o.send_counts : std::vector<std::size_t>(size_, o.count);
  const std::vector<std::size_t> recv_counts =
      per_peer ? o.recv_counts : std::vector<std::size_t>(size_, o.count);
  const auto send_at = Offsets(send_counts, esize), recv_at = Offsets(recv_counts, esize);
  NEURON_CHECK((o.input != nullptr || send_at.back() == 0) &&
                   (o.output != nullptr || recv_at.back() == 0),
               "alltoall: input or output is null");
  Header h = NewHeader(OpCode::kAllToAll, o.dtype, per_peer ? detail::kPerPeerSizes : o.count);
  h.model_bytes = static_cast<double>(send_at.back());
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const Label what = Describing(h);
  const char* in = static_cast<const char*>(o.input);
  char* out = static_cast<char*>(o.output);
  NEURON_CHECK(send_counts[rank_] == recv_counts[rank_], what, ": rank ", rank_,
               " sends ", send_counts[rank_], " elements to itself but expects ",
               recv_counts[rank_]);
  if (send_counts[rank_] > 0) {
    std::memmove(out + recv_at[rank_], in + send_at[rank_], send_counts[rank_] * esize);
  }
  for (int k = 1; k < size_; ++k) {
    const int to = Mod(rank_ + k, size_), from = Mod(rank_ - k, size_);
    if (per_peer) {
      std::uint64_t sending = send_counts[to], coming = 0;
      Exchange(to, &sending, sizeof(sending), from, &coming, sizeof(coming), what);
      if (coming != recv_counts[from]) {
        const std::string message =
            StrCat(what, ": rank ", from, " sends ", coming, " elements to rank ", rank_,
                   ", which expects ", recv_counts[from]);
        transport_->Abort(message);
        throw InvalidUsage(message);
      }
    }
    Exchange(to, in + send_at[to], send_counts[to] * esize, from, out + recv_at[from],
             recv_counts[from] * esize, what);
  }
}

// Ring allgather over blocks of different sizes: in step k rank r passes on
// the block of rank r - k and receives that of rank r - k - 1.
void Communicator::AllGatherV(const AllGatherVOptions& o) {
  NEURON_CHECK(o.counts.size() == static_cast<std::size_t>(size_),
               "allgatherv: counts needs one entry per rank (", size_, "), got ",
               o.counts.size());
  const std::size_t esize = ElementSize(o.dtype);
  const auto at = Offsets(o.counts, esize);
  NEURON_CHECK((o.input != nullptr || o.counts[rank_] == 0) &&
                   (o.output != nullptr || at.back() == 0),
               "allgatherv: input or output is null");
  Header h = NewHeader(OpCode::kAllGatherV, o.dtype,
                       std::accumulate(o.counts.begin(), o.counts.end(), std::size_t{0}));
  h.fingerprint = Fingerprint(o.counts);
  h.model_bytes = static_cast<double>(at.back());
  const Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  char* out = static_cast<char*>(o.output);
  if (o.counts[rank_] > 0)
    std::memmove(out + at[rank_], o.input, o.counts[rank_] * esize);
  const Label what = Describing(h);
  const int right = Mod(rank_ + 1, size_), left = Mod(rank_ - 1, size_);
  for (int k = 0; k < size_ - 1; ++k) {
    const int send_block = Mod(rank_ - k, size_), recv_block = Mod(rank_ - k - 1, size_);
    Exchange(right, out + at[send_block], o.counts[send_block] * esize, left,
             out + at[recv_block], o.counts[recv_block] * esize, what);
  }
}

}  // namespace neuron::collectives
