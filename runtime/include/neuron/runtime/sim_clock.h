// A rank's simulated clocks (docs/architecture.md, "Two clocks"): the
// compute stream advances by the modelled duration of the work the rank
// runs; the collective clock records the latest collective end (each
// communicator keeps its own stream and arrival, from the compute clock at
// issue). Waiting on a collective from the compute stream joins the clocks.
//
// Usage:
//   SimClock clock;
//   clock.AdvanceCompute(SimDuration(120));           // a graph ran
//   double issued = clock.compute().count();          // a collective is issued
//   clock.FinishCollective(end);                      // after the collective
//   clock.JoinCompute(end);                           // work.wait()
//
// Thread-safe: a rank's compute thread and its progress thread share it.
// The clocks are atomics (every collective reads and advances them; no
// lock); the mutex guards the trace.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "neuron/runtime/sim_time.h"

namespace neuron::runtime {

class OpTrace;

class SimClock {
 public:
  SimDuration compute() const;
  SimDuration collective() const;
  // What AdvanceCompute charged in all (the device model's compute, not the
  // waits that joined the compute stream to the collectives).
  SimDuration charged() const;

  void AdvanceCompute(SimDuration d);
  // A collective of this rank ended at `end` (the latest is kept).
  void FinishCollective(SimDuration end);
  // The compute stream waits for an event at `t`: compute = max(compute, t).
  void JoinCompute(SimDuration t);
  void Reset();

  // While a trace is set, compute charges are recorded into it, and the
  // communicators sharing this clock record what they issue (op_trace.h).
  void set_trace(std::shared_ptr<OpTrace> trace);
  std::shared_ptr<OpTrace> trace() const;
  // Whether a trace is set: lock-free, for the per-operation check.
  bool tracing() const { return tracing_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mutex_;       // trace_
  std::atomic<double> compute_{0};     // microseconds
  std::atomic<double> collective_{0};
  std::atomic<double> charged_{0};
  std::shared_ptr<OpTrace> trace_;
  std::atomic<bool> tracing_{false};
};

// The clock of the rank this process runs (one rank per process: under
// neuronrun, mpirun or srun). The Python package hands it to the neuron
// process groups it creates, and compiled graphs advance its compute
// stream, so collectives see when compute reached them. Tests that run
// several ranks as threads give each communicator a clock of its own.
std::shared_ptr<SimClock> ProcessClock();

// Compute work this process has queued but not yet charged to its clock
// (adaptive eager's open region, runtime/aten adaptive_eager.h). Whoever
// places other work after the compute stream (a collective's issue, a
// compiled graph's run, a device sync or event) settles it first, so the
// clock is charged in program order. `reason` names the caller's point
// ("collective", "sync", "other"). One hook per process, set once by the
// layer that queues; without one, settling does nothing. Thread-safe.
using PendingComputeHook = void (*)(const char* reason);
void SetPendingComputeHook(PendingComputeHook hook);
void SettlePendingCompute(const char* reason);

}  // namespace neuron::runtime
