#include "neuron/runtime/sim_clock.h"

#include <algorithm>

#include "neuron/runtime/op_trace.h"

namespace neuron::runtime {

namespace {

// value = max(value, x), atomically.
void StoreMax(std::atomic<double>& value, double x) {
  double seen = value.load(std::memory_order_relaxed);
  while (seen < x && !value.compare_exchange_weak(seen, x, std::memory_order_acq_rel)) {
  }
}

}  // namespace

SimDuration SimClock::compute() const {
  return SimDuration(compute_.load(std::memory_order_acquire));
}

SimDuration SimClock::charged() const {
  return SimDuration(charged_.load(std::memory_order_acquire));
}

SimDuration SimClock::collective() const {
  return SimDuration(collective_.load(std::memory_order_acquire));
}

void SimClock::AdvanceCompute(SimDuration d) {
  double seen = compute_.load(std::memory_order_relaxed);
  while (!compute_.compare_exchange_weak(seen, seen + d.count(), std::memory_order_acq_rel)) {
  }
  double total = charged_.load(std::memory_order_relaxed);
  while (!charged_.compare_exchange_weak(total, total + d.count(),
                                         std::memory_order_relaxed)) {
  }
  if (tracing()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (trace_) trace_->Compute(d);
  }
}

void SimClock::FinishCollective(SimDuration end) { StoreMax(collective_, end.count()); }

void SimClock::JoinCompute(SimDuration t) { StoreMax(compute_, t.count()); }

std::shared_ptr<SimClock> ProcessClock() {
  static const std::shared_ptr<SimClock> clock = std::make_shared<SimClock>();
  return clock;
}

namespace {
std::atomic<PendingComputeHook> pending_hook{nullptr};
}  // namespace

void SetPendingComputeHook(PendingComputeHook hook) { pending_hook.store(hook); }

void SettlePendingCompute(const char* reason) {
  if (const PendingComputeHook hook = pending_hook.load(std::memory_order_acquire)) {
    hook(reason);
  }
}

void SimClock::Reset() {
  compute_.store(0);
  collective_.store(0);
  charged_.store(0);
}

void SimClock::set_trace(std::shared_ptr<OpTrace> trace) {
  std::lock_guard<std::mutex> lock(mutex_);
  tracing_.store(trace != nullptr, std::memory_order_release);
  trace_ = std::move(trace);
}

std::shared_ptr<OpTrace> SimClock::trace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return trace_;
}

}  // namespace neuron::runtime
