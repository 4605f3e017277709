// The posted sends and receives of a transport: ids, per-peer FIFO queues
// (streams are ordered per pair), progress counters, and the descriptions
// errors need. Shared by every transport; not thread-safe (one thread
// drives a transport).
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "neuron/collectives/transport/transport.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives::transport {

class RequestTable {
 public:
  struct Request {
    int peer = 0;
    bool is_send = false;
    char* data = nullptr;
    std::size_t bytes = 0;
    std::size_t done = 0;
    bool complete() const { return done == bytes; }
  };

  explicit RequestTable(int size) : size_(size), sends_(size), recvs_(size) {}

  RequestId Post(int peer, bool is_send, const void* data, std::size_t bytes) {
    CheckUsable();
    NEURON_CHECK(peer >= 0 && peer < size_, is_send ? "send to" : "receive from", " rank ",
                 peer, " outside 0..", size_ - 1);
    const RequestId id = first_id_ + requests_.size();
    requests_.push_back({peer, is_send, const_cast<char*>(static_cast<const char*>(data)),
                         bytes, 0});
    (is_send ? sends_ : recvs_)[peer].push_back(id);
    return id;
  }

  // Only for ids still queued (progress); use IsComplete for any id.
  Request& at(RequestId id) { return requests_[id - first_id_]; }
  const Request& at(RequestId id) const { return requests_[id - first_id_]; }

  // Ids below first_id_ were compacted away, which happens only once every
  // request is complete: a caller may hold such an id (e.g. a receive it
  // posted and has not looked at yet), and it is complete.
  bool IsComplete(RequestId id) const { return id < first_id_ || at(id).complete(); }
  // The queue of sends to (receives from) `peer`, oldest first.
  std::deque<RequestId>& sends(int peer) { return sends_[peer]; }
  std::deque<RequestId>& recvs(int peer) { return recvs_[peer]; }

  bool AllComplete(const std::vector<RequestId>& ids) const {
    for (RequestId id : ids) {
      if (!IsComplete(id)) return false;
    }
    return true;
  }

  // The index of a complete request in `ids`, or ids.size() if none is.
  std::size_t FirstComplete(const std::vector<RequestId>& ids) const {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (IsComplete(ids[i])) return i;
    }
    return ids.size();
  }

  // "receive from rank 3 (0 of 8 bytes), ..." for the unfinished ones.
  std::string Pending(const std::vector<RequestId>& ids) const {
    std::string out;
    for (RequestId id : ids) {
      if (IsComplete(id)) continue;
      const Request& r = at(id);
      if (!out.empty()) out += ", ";
      out += StrCat(r.is_send ? "send to rank " : "receive from rank ", r.peer, " (", r.done,
                    " of ", r.bytes, " bytes)");
    }
    return out;
  }

  std::vector<int> PendingPeers(const std::vector<RequestId>& ids) const {
    std::vector<int> peers;
    for (RequestId id : ids) {
      if (!IsComplete(id)) peers.push_back(at(id).peer);
    }
    return peers;
  }

  // After a failed Wait: the posted buffers may be gone and the streams are
  // out of step, so every request is dropped and the table refuses more.
  void Break(const std::string& reason) {
    broken_ = reason.empty() ? "an earlier operation failed" : reason;
    for (auto& q : sends_) q.clear();
    for (auto& q : recvs_) q.clear();
    first_id_ += requests_.size();
    requests_.clear();
  }
  // Runs a wait: refused once broken, and any error breaks the table.
  template <typename F>
  void Guarded(F wait) {
    CheckUsable();
    try {
      wait();
    } catch (const std::exception& e) {
      Break(e.what());
      throw;
    }
  }

  void CheckUsable() const {
    if (!broken_.empty()) {
      throw IoError("transport unusable after an earlier failure: " + broken_);
    }
  }

  // Forgets finished requests once no queue holds any, so ids stay cheap.
  void CompactIfIdle() {
    for (int p = 0; p < size_; ++p) {
      if (!sends_[p].empty() || !recvs_[p].empty()) return;
    }
    first_id_ += requests_.size();
    requests_.clear();
  }

 private:
  int size_;
  std::string broken_;             // why the table refuses requests
  std::vector<Request> requests_;  // by id - first_id_
  RequestId first_id_ = 0;
  std::vector<std::deque<RequestId>> sends_;
  std::vector<std::deque<RequestId>> recvs_;
};

// The bodies of Transport::Wait, TryWait and WaitAny, shared by the
// transports: `wait_until(done, expired)` makes progress until done() holds
// or the deadline passes (then it sets *expired when that is not null, and
// throws TimeoutError otherwise).
template <typename WaitUntil>
void WaitAllOf(RequestTable& r, const std::vector<RequestId>& ids, WaitUntil wait_until) {
  r.Guarded([&] { wait_until([&] { return r.AllComplete(ids); }, nullptr); });
  r.CompactIfIdle();
}

template <typename WaitUntil>
bool TryWaitAllOf(RequestTable& r, const std::vector<RequestId>& ids,
                  WaitUntil wait_until) {
  bool expired = false;
  r.Guarded([&] { wait_until([&] { return r.AllComplete(ids); }, &expired); });
  if (!expired) r.CompactIfIdle();
  return !expired;
}

template <typename WaitUntil>
std::size_t WaitAnyOf(RequestTable& r, const std::vector<RequestId>& ids,
                      WaitUntil wait_until) {
  r.Guarded(
      [&] { wait_until([&] { return r.FirstComplete(ids) < ids.size(); }, nullptr); });
  return r.FirstComplete(ids);
}

 }  // namespace neuron::collectives::transport
