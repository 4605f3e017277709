#include "neuron/runtime/sim_clock.h"

#include <algorithm>

#include "neuron/runtime/op_trace.h"

namespace neuron::runtime {

SimDuration SimClock::compute() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return compute_;
}

SimDuration SimClock::collective() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return collective_;
}

void SimClock::AdvanceCompute(SimDuration d) {
  std::lock_guard<std::mutex> lock(mutex_);
  compute_ += d;
  if (trace_) trace_->Compute(d);
}

void SimClock::FinishCollective(SimDuration end) {
  std::lock_guard<std::mutex> lock(mutex_);
  collective_ = std::max(collective_, end);
}

void SimClock::JoinCompute(SimDuration t) {
  std::lock_guard<std::mutex> lock(mutex_);
  compute_ = std::max(compute_, t);
}

std::shared_ptr<SimClock> ProcessClock() {
  static const std::shared_ptr<SimClock> clock = std::make_shared<SimClock>();
  return clock;
}

void SimClock::Reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  compute_ = collective_ = SimDuration(0);
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
