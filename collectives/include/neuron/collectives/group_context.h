// The small context the host algorithms run over (as Gloo's Context): a
// group's rank and size, its transport and the shared windows when the
// transport offers them, the timeout of the running operation, and the
// algorithms' scratch. The algorithms are free functions over it, one
// family per file (collectives/src/algorithms.h). A Communicator is one
// (privately): it adds the collectives' API and, around each algorithm,
// the call check (handshake.h), the tuner's choice (tuner.h) and the
// two-clock accounting (op_accounting.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "neuron/collectives/transport/shared_windows.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives {

class GroupContext {
 public:
  GroupContext(const GroupContext&) = delete;
  GroupContext& operator=(const GroupContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  transport::Transport& transport() const { return *transport_; }
  // Null when the transport has no shared windows (TCP).
  transport::SharedWindows* windows() const { return windows_; }
  // A deadline for the running operation's next wait: the operation's
  // timeout (set_operation_timeout), else the group's.
  transport::Deadline NewDeadline() const;
  // The timeout of the operations run from now on, until set again (c10d
  // sets each call's before running it, as Gloo passes it in the call's
  // options); zero or less: the group's. Collectives only: point-to-point
  // messages, which may run on another thread, keep their own
  // (Communicator::set_message_timeout).
  void set_operation_timeout(std::chrono::milliseconds timeout) { op_timeout_ = timeout; }
  // Sends `send_bytes` to `send_to` while receiving `recv_bytes` from
  // `recv_from`; returns when both are done.
  void Exchange(int send_to, const void* send, std::size_t send_bytes, int recv_from,
                void* recv, std::size_t recv_bytes, const transport::Label& what);
  // The data area of rank `rank`'s shared window (after its header slots),
  // and its size. Only with windows().
  char* WindowData(int rank) const;
  std::size_t WindowDataBytes() const;
  // Uses of the windows' data areas so far: the direct algorithms' phase
  // sequence (every rank counts the same).
  std::uint64_t& window_sequence() { return window_sequence_; }
  std::vector<char>& scratch() { return scratch_; }

 protected:
  GroupContext(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout) {}
  ~GroupContext() = default;

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds op_timeout_{0};
  std::unique_ptr<transport::Transport> transport_;
  transport::SharedWindows* windows_ = nullptr;
  std::uint64_t window_sequence_ = 0;
  std::vector<char> scratch_;
};

}  // namespace neuron::collectives
