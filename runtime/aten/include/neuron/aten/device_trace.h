// The device ops a torch.profiler session sees: while a session records, each
// eager op the "neuron" device charges (every OpLog::Add) is also kept here,
// with the correlation id of the profiled host op that issued it and the wall
// time it was issued, so the profiler can show it on the device's lane and
// attribute its modelled time to that op (kineto_profiler.cc).
//
// Usage (the Kineto session does this; OpLog::Add calls Add):
//   DeviceTrace::Start();                    // clears, starts recording
//   DeviceTrace::PushCorrelation(id);        // on the thread running the op
//   ... ops run: OpLog::Add -> DeviceTrace::Add(record) ...
//   DeviceTrace::PopCorrelation();
//   std::vector<DeviceOp> ops = DeviceTrace::Stop();
//
// When no session records, Add costs one relaxed atomic load in OpLog::Add.
// Thread-safe: ops run on autograd's threads too; correlation stacks are per
// thread, as the profiler pushes them on the thread that runs the op.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "neuron/aten/op_log.h"

namespace neuron::aten {

struct DeviceOp {
  const char* op = "";            // e.g. "aten::mm" (lives forever)
  const char* kind = "";          // runtime::EagerKind name
  double start_us = 0;            // the rank's simulated compute clock at issue
  double modelled_us = 0;         // the device model's time: its device time
  std::int64_t issued_ns = 0;     // wall clock (ns since the epoch) when charged
  std::uint64_t correlation = 0;  // innermost profiled host op; 0: none
  int device = 0;                 // the issuing thread's current device
};

class DeviceTrace {
 public:
  // True between Start and Stop.
  static bool Recording() { return recording_.load(std::memory_order_relaxed); }
  static void Start();
  // Stops recording and returns the ops since Start, in issue order.
  static std::vector<DeviceOp> Stop();
  // Keeps `record` when recording (OpLog::Add calls it for every op).
  static void Add(const EagerRecord& record);

  // The calling thread's profiled host ops, innermost last. A pop with
  // nothing pushed (a session that began inside an op) is ignored.
  static void PushCorrelation(std::uint64_t id);
  static void PopCorrelation();

 private:
  inline static std::atomic<bool> recording_{false};
};

}  // namespace neuron::aten
