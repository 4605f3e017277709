// Private to the communicator's implementation files: the accounting hook
// around each operation, the default window size and the point-to-point
// channel. The vocabulary they share with the algorithms is wire.h.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "neuron/collectives/communicator.h"
#include "neuron/collectives/transport/transport.h"
#include "neuron/runtime/cycle_clock.h"
#include "op_accounting.h"
#include "wire.h"

namespace neuron::collectives {

// The accounting hook around one operation: once it completed on this
// rank, accounts it on both clocks (op_accounting.h). Holds references: the
// header and agreement outlive it (locals declared before it in the
// operation).
class Communicator::OpScope {
 public:
  OpScope(Communicator& comm, const detail::Header& header, const detail::Agreed& agreed)
      : comm_(comm),
        header_(header),
        agreed_(agreed),
        exceptions_(std::uncaught_exceptions()),
        wall_start_(runtime::CycleClock::Now()) {}
  // May throw (the fabric model refuses a route a fault cut): the error
  // reaches the caller of the operation, as its own would.
  ~OpScope() noexcept(false) {
    if (std::uncaught_exceptions() != exceptions_) return;  // failed: nothing to account
    const double wall = runtime::CycleClock::Micros(runtime::CycleClock::Now() - wall_start_);
    comm_.accounting_->Record(header_, agreed_, wall, comm_.registered_op_);
  }

 private:
  Communicator& comm_;
  const detail::Header& header_;
  const detail::Agreed& agreed_;
  int exceptions_;
  std::int64_t wall_start_;
};

// The shared-memory window: as configured, or 8 MiB shared by the ranks
// (at most 1 MiB, at least 64 KiB each). The direct allreduce moves its
// data through every rank's window one window-sized round at a time; while
// all the windows together stay in the last-level cache, the reduction and
// the copy out read from cache, not memory. Measured with neuron-cc-perf,
// 1-64 MiB allreduce on 2 cores (docs/performance.md): 1 MiB windows are
// fastest at 2-8 ranks, 512 KiB at 16, where 8 MiB windows (the earlier
// choice, to save phase waits) were 1.2-1.5x slower.
inline std::size_t WindowBytesFor(std::size_t configured, int ranks) {
  if (configured != 0) return configured;
  constexpr std::size_t kAllWindows = 8u << 20, kMost = 1u << 20, kLeast = 64u << 10;
  const std::size_t share = kAllWindows / static_cast<std::size_t>(std::max(ranks, 1));
  return std::clamp(share & ~std::size_t{4095}, kLeast, kMost);
}

struct Communicator::PointToPoint {
  // The channel's own namespace in the store; the TCP transport keeps a
  // reference to it (abort reasons), so it lives as long as the transport.
  std::shared_ptr<Store> store;
  std::unique_ptr<transport::Transport> transport;
  std::vector<detail::MessageHeader> incoming;                  // per peer, posted buffers
  std::vector<std::optional<transport::RequestId>> posted;  // header receive per peer
  std::vector<std::deque<detail::Message>> unexpected;          // arrived, other tags
  std::uint64_t sends = 0, receives = 0;
  // Sends handed to the transport whose bytes have not all left yet: each
  // owns its header and a copy of its payload. Oldest first.
  struct InFlight {
    detail::MessageHeader header;
    std::vector<char> payload;
    std::vector<transport::RequestId> ids;
    std::string what;
  };
  std::deque<InFlight> in_flight;
  std::size_t in_flight_bytes = 0;
  // The first error that background progress met; every later send or
  // receive rethrows it.
  std::exception_ptr failed;
};

}  // namespace neuron::collectives
