// Shared windows: a capability a transport may offer (Transport::windows())
// when every rank of the group maps every other rank's memory. Each rank
// owns one window, readable and writable by every rank, and a few phase
// counters that order the windows' use; the direct algorithms reduce
// straight from the windows (collectives/src/direct_algorithms.cc). Over a
// transport without them (TCP) the algorithms exchange messages instead.
//
// Usage:
//   if (transport::SharedWindows* w = transport.windows()) {
//     std::memcpy(w->Window(rank), data, bytes);
//     w->SyncPhase(0, ++sequence, deadline, "allreduce #3");  // all staged
//     ... read w->Window(peer) ...
//   }
#pragma once

#include <cstddef>
#include <cstdint>

#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives::transport {

class SharedWindows {
 public:
  static constexpr int kPhases = 4;  // phase counters per rank

  virtual ~SharedWindows() = default;

  // Rank `rank`'s window, window_bytes() long.
  virtual char* Window(int rank) const = 0;
  virtual std::size_t window_bytes() const = 0;
  // Publish sets this rank's counter `index` (0..kPhases-1) to `value` and
  // wakes the peers that sleep on it; WaitPhase blocks until every rank's
  // counter `index` is at least `value` (errors as Transport::Wait).
  virtual void PublishPhase(int index, std::uint64_t value) = 0;
  virtual void WaitPhase(int index, std::uint64_t value, Deadline deadline,
                         const Label& what) = 0;
  // PublishPhase, then WaitPhase: a barrier on the counter.
  virtual void SyncPhase(int index, std::uint64_t value, Deadline deadline,
                         const Label& what) = 0;
  // SyncPhase on a 64-bit word of the windows, at `offset` (8-aligned) in
  // every rank's: a flag that shares a cache line with what it guards (the
  // communicator's headers), so a waiting peer moves that one line. The
  // store follows (release) everything this rank wrote before.
  virtual void SyncWindowWord(std::size_t offset, std::uint64_t value, Deadline deadline,
                              const Label& what) = 0;
};

}  // namespace neuron::collectives::transport
