// What the compute stream knew when it issued the operation a lane thread
// now runs (async_communicator.h): the compute clock at issue, so the
// operation's simulated start does not depend on when the lane got to it,
// and the trace entry the operation's parts fill (op_trace.h). The lane
// thread installs it around the operation with ScopedIssue; a receive
// leaves in it when its bytes arrived, for the waiter to join.
#pragma once

#include <cstdint>
#include <memory>

namespace neuron::runtime {
class OpTrace;
class SimClock;
}  // namespace neuron::runtime

namespace neuron::collectives::detail {

struct IssueContext {
  const runtime::SimClock* clock = nullptr;  // applies to communicators on this clock
  double issued_us = 0;                      // the compute stream at issue
  std::shared_ptr<runtime::OpTrace> trace;   // null: not recorded
  std::uint64_t index = 0;                   // the issue in `trace`
  bool received = false;                     // a receive ran ...
  double received_us = 0;                    // ... and completed then
};

// Installs `context` for this thread's operations while it exists.
class ScopedIssue {
 public:
  explicit ScopedIssue(IssueContext* context);
  ~ScopedIssue();
  ScopedIssue(const ScopedIssue&) = delete;
  ScopedIssue& operator=(const ScopedIssue&) = delete;

  // The context installed on this thread for `clock`, or null.
  static IssueContext* Current(const runtime::SimClock* clock);

 private:
  IssueContext* previous_;
};

}  // namespace neuron::collectives::detail
