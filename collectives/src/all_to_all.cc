// Communicator::AllToAll (equal or per-peer sizes) and AllGatherV (uneven
// blocks); their algorithms: exchange_algorithms.cc.
#include <numeric>
#include <vector>

#include "algorithms.h"
#include "communicator_internal.h"
#include "handshake.h"
#include "neuron/collectives/communicator.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::OpCode;

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
      NewHeader(OpCode::kAllToAll, o.dtype, per_peer ? detail::kPerPeerSizes : o.count);
  h.model_bytes = static_cast<double>(send.offsets.back());
  const detail::Agreed agreed = Handshake(h);
  const OpScope scope(*this, h, agreed);
  PairwiseAllToAll(*this, static_cast<const char*>(o.input), static_cast<char*>(o.output),
                   send, recv, per_peer, detail::Handshake::Describing(h));
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
