// Point-to-point messages: framed (tag, size, send time) on a transport of
// their own, so they never interleave with the collectives' streams.
#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>

#include "communicator_internal.h"
#include "handshake.h"  // ~Communicator
#include "hierarchy.h"  // ~Communicator
#include "neuron/collectives/communicator.h"
#include "neuron/collectives/store/prefix_store.h"
#include "neuron/collectives/transport/shared_buffers.h"  // ~Communicator: PeerBufferMap
#include "neuron/collectives/transport/shm_transport.h"
#include "neuron/collectives/transport/tcp_transport.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

using detail::Message;
using detail::MessageHeader;

Communicator::~Communicator() = default;

void Communicator::StartPointToPoint(bool one_host, const CommunicatorOptions& options) {
  auto p2p = std::make_unique<PointToPoint>();
  p2p->store = std::make_shared<PrefixStore>("p2p", store_);
  Store& store = *p2p->store;
  if (one_host && options.transport != TransportKind::kTcp) {
    transport::ShmOptions shm;
    shm.ring_bytes = options.shm_ring_bytes;
    shm.window_bytes = 4096;  // point-to-point uses the rings only
    shm.setup_timeout = options.timeout;
    shm.global_ranks = options.global_ranks;
    p2p->transport = std::make_unique<transport::ShmTransport>(store, rank_, size_, shm);
  } else {
    transport::TcpOptions tcp;
    tcp.address = options.tcp_address;
    tcp.loopback = one_host;
    tcp.setup_timeout = options.timeout;
    tcp.secret = options.transport_secret;
    p2p->transport = std::make_unique<transport::TcpTransport>(store, rank_, size_, tcp);
  }
  p2p->incoming.resize(size_);
  p2p->posted.resize(size_);
  p2p->unexpected.resize(size_);
  p2p_ = std::move(p2p);
}

void Communicator::AbortPointToPoint(const std::string& reason) {
  if (p2p_ != nullptr) p2p_->transport->Abort(reason);
}

void Communicator::Send(int peer, const void* data, std::size_t bytes, std::uint64_t tag) {
  NEURON_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send: peer ", peer,
               " must be another rank of 0..", size_ - 1, " (this is rank ", rank_, ")");
  NEURON_CHECK(data != nullptr || bytes == 0, "send: data is null");
  if (p2p_->failed) std::rethrow_exception(p2p_->failed);
  accounting_->TraceMessage(true, peer, bytes, tag);
  auto& t = *p2p_->transport;
  if (!buffered_sends_) {  // as MPI_Send: returns once the bytes left
    MessageHeader h;
    h.tag = tag;
    h.bytes = bytes;
    h.send_us = accounting_->IssueTime();
    const std::string what =
        StrCat("send #", p2p_->sends++, " to rank ", peer, " (tag ", tag, ")");
    std::vector<transport::RequestId> ids = {t.Isend(peer, &h, sizeof(h))};
    if (bytes > 0) ids.push_back(t.Isend(peer, data, bytes));
    t.Wait(ids, MessageDeadline(), what);
    return;
  }
  // Buffered, as MPI_Bsend: the message is copied and handed to the
  // transport, whose bytes leave during any later wait on this channel (a
  // receive, or the background progress of ProgressSends). So two ranks
  // may send each other large messages before receiving.
  PointToPoint::InFlight& m = p2p_->in_flight.emplace_back();
  m.header.tag = tag;
  m.header.bytes = bytes;
  m.header.send_us = accounting_->IssueTime();
  m.what = StrCat("send #", p2p_->sends++, " to rank ", peer, " (tag ", tag, ")");
  m.payload.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  m.ids.push_back(t.Isend(peer, &m.header, sizeof(m.header)));
  if (bytes > 0) m.ids.push_back(t.Isend(peer, m.payload.data(), bytes));
  p2p_->in_flight_bytes += bytes;
  ReapSends(transport::Clock::now());  // drop what already left
  // Bound the copies held: past kMaxBufferedBytes, wait for the oldest.
  while (p2p_->in_flight_bytes > kMaxBufferedBytes && !p2p_->in_flight.empty()) {
    PointToPoint::InFlight& oldest = p2p_->in_flight.front();
    t.Wait(oldest.ids, MessageDeadline(), oldest.what);
    p2p_->in_flight_bytes -= oldest.payload.size();
    p2p_->in_flight.pop_front();
  }
}

void Communicator::ReapSends(transport::Clock::time_point until) {
  auto& t = *p2p_->transport;
  while (!p2p_->in_flight.empty()) {
    PointToPoint::InFlight& oldest = p2p_->in_flight.front();
    if (!t.TryWait(oldest.ids, transport::Deadline::Until(until), oldest.what)) return;
    p2p_->in_flight_bytes -= oldest.payload.size();
    p2p_->in_flight.pop_front();
  }
}

bool Communicator::ProgressSends(std::chrono::milliseconds at_most) {
  if (p2p_ == nullptr || p2p_->failed) return false;
  try {
    ReapSends(transport::Clock::now() + at_most);
  } catch (...) {
    p2p_->failed = std::current_exception();
    return false;
  }
  return !p2p_->in_flight.empty();
}

int Communicator::Recv(int peer, void* data, std::size_t bytes, std::uint64_t tag) {
  NEURON_CHECK(peer == kAnySource || (peer >= 0 && peer < size_ && peer != rank_),
               "recv: peer ", peer, " must be another rank of 0..", size_ - 1,
               " or kAnySource (this is rank ", rank_, ")");
  NEURON_CHECK(data != nullptr || bytes == 0, "recv: data is null");
  if (p2p_->failed) std::rethrow_exception(p2p_->failed);
  const double posted_us = accounting_->IssueTime();
  const std::string what = StrCat("recv #", p2p_->receives++, " from ",
                                  peer == kAnySource ? std::string("any rank")
                                                     : "rank " + std::to_string(peer),
                                  " (tag ", tag, ")");
  auto& t = *p2p_->transport;
  // 1. A message with this tag that arrived while waiting for another.
  //    incoming[p] is never written here: a header receive an earlier
  //    any-source receive posted may still be landing in it.
  int source = -1;
  double send_us = 0;
  for (int p = 0; p < size_ && source < 0; ++p) {
    if (peer != kAnySource && p != peer) continue;
    auto& queue = p2p_->unexpected[p];
    auto it = std::find_if(queue.begin(), queue.end(),
                           [tag](const Message& m) { return m.header.tag == tag; });
    if (it == queue.end()) continue;
    NEURON_CHECK(it->header.bytes == bytes, what, ": rank ", p, " sent ", it->header.bytes,
                 " bytes but the receive expects ", bytes);
    if (bytes > 0) std::memcpy(data, it->payload.data(), bytes);
    send_us = it->header.send_us;  // for the timing below
    queue.erase(it);
    source = p;
  }
  // 2. Otherwise read headers (from `peer`, or whoever sends first) until
  //    one carries this tag; the others' payloads are kept for later.
  while (source < 0) {
    std::vector<transport::RequestId> ids;
    std::vector<int> from;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || (peer != kAnySource && p != peer)) continue;
      if (!p2p_->posted[p]) {
        p2p_->posted[p] = t.Irecv(p, &p2p_->incoming[p], sizeof(MessageHeader));
      }
      ids.push_back(*p2p_->posted[p]);
      from.push_back(p);
    }
    const int p = from[t.WaitAny(ids, MessageDeadline(), what)];
    p2p_->posted[p].reset();
    const MessageHeader h = p2p_->incoming[p];
    NEURON_ASSERT(h.magic == 0x4e503250, "point-to-point stream from rank ", p, " is corrupt");
    if (h.tag == tag && h.bytes == bytes) {
      if (bytes > 0) t.Wait({t.Irecv(p, data, bytes)}, MessageDeadline(), what);
      source = p;
      send_us = h.send_us;
      break;
    }
    Message m{h, std::vector<char>(h.bytes)};
    if (h.bytes > 0) t.Wait({t.Irecv(p, m.payload.data(), h.bytes)}, MessageDeadline(), what);
    NEURON_CHECK(h.tag != tag, what, ": rank ", p, " sent ", h.bytes,
                 " bytes but the receive expects ", bytes);
    p2p_->unexpected[p].push_back(std::move(m));
  }
  // Simulated time: max(posted, sent + the modelled transfer).
  accounting_->FinishReceive(source, bytes, posted_us, send_us);
  accounting_->TraceMessage(false, source, bytes, tag);
  return source;
}

}  // namespace neuron::collectives
