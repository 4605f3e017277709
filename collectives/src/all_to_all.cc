// Communicator::AllToAll (equal or per-peer sizes, any mix across ranks)
// and AllGatherV (uneven blocks); their algorithms: exchange_algorithms.cc.
#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "algorithms.h"
#include "communicator_internal.h"
#include "handshake.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::OpCode;

namespace {

// This rank's form of an all-to-all, for its header: the count when it
// sends and receives the same number of elements to and from every rank
// (however the caller passed them), else kPerPeerSizes.
std::uint64_t FormCount(const std::vector<std::size_t>& send,
                        const std::vector<std::size_t>& recv) {
  const bool same = std::adjacent_find(send.begin(), send.end(),
                                       std::not_equal_to<>()) == send.end();
  return same && send == recv && !send.empty() ? send[0] : detail::kPerPeerSizes;
}

}  // namespace

// Each rank passes its own form; the ranks agree on the variant in the
// handshake (no message of its own): when every header shows the same
// count, every rank sends and expects that count from every other, and the
// blocks go as they are; otherwise some rank's sizes differ per peer, and
// every rank first exchanges and checks the count of each block (so any
// mix of equal, uneven and zero blocks works, as with Gloo, and a
// disagreement is an error naming both ranks).
void Communicator::AllToAll(const AllToAllOptions& o) {
  const bool per_peer = !o.send_counts.empty() || !o.recv_counts.empty();
  NEURON_CHECK(!per_peer || (o.send_counts.size() == static_cast<std::size_t>(size_) &&
                             o.recv_counts.size() == static_cast<std::size_t>(size_)),
               "alltoall: send_counts and recv_counts need one entry per rank (", size_,
               ")");
  const std::size_t esize = ElementSize(o.dtype);
  const BlockLayout send(
      per_peer ? o.send_counts : std::vector<std::size_t>(size_, o.count), esize);
  const BlockLayout recv(
      per_peer ? o.recv_counts : std::vector<std::size_t>(size_, o.count), esize);
  NEURON_CHECK((o.input != nullptr || send.offsets.back() == 0) &&
                   (o.output != nullptr || recv.offsets.back() == 0),
               "alltoall: input or output is null");
  detail::Header h =
      NewHeader(OpCode::kAllToAll, o.dtype, FormCount(send.counts, recv.counts));
  // The fabric model prices the busiest rank's larger side: a rank that
  // receives more than any rank sends (a popular expert) sets the time.
  h.model_bytes = static_cast<double>(std::max(send.offsets.back(), recv.offsets.back()));
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  const bool equal_blocks = agreed.SameCount() && h.count != detail::kPerPeerSizes;
  PairwiseAllToAll(*this, static_cast<const char*>(o.input), static_cast<char*>(o.output),
                   send, recv, !equal_blocks, detail::Handshake::Describing(h));
}

void Communicator::AllGatherV(const AllGatherVOptions& o) {
  NEURON_CHECK(o.counts.size() == static_cast<std::size_t>(size_),
               "allgatherv: counts needs one entry per rank (", size_, "), got ",
               o.counts.size());
  const BlockLayout blocks(o.counts, ElementSize(o.dtype));
  NEURON_CHECK((o.input != nullptr || o.counts[rank_] == 0) &&
                   (o.output != nullptr || blocks.offsets.back() == 0),
               "allgatherv: input or output is null");
  detail::Header h =
      NewHeader(OpCode::kAllGatherV, o.dtype,
                std::accumulate(o.counts.begin(), o.counts.end(), std::size_t{0}));
  h.fingerprint = Fingerprint(o.counts);
  h.model_bytes = static_cast<double>(blocks.offsets.back());
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  RingAllGatherV(*this, o.input, static_cast<char*>(o.output), blocks,
                 detail::Handshake::Describing(h));
}

}  // namespace neuron::collectives
