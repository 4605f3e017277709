#include "neuron/runtime/device/memory_counters.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

void RaiseTo(MemoryLevels& peak, const MemoryLevels& now) {
  peak.reserved = std::max(peak.reserved, now.reserved);
  peak.allocated = std::max(peak.allocated, now.allocated);
  peak.active = std::max(peak.active, now.active);
}

}  // namespace

void MemoryCounters::SetPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.phase = phase;
  RaiseTo(state_.phases[phase], state_.current);
}

void MemoryCounters::Update(std::uint64_t MemoryLevels::*field, std::int64_t delta,
                            const char* name, const char* level) {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryLevels next = state_.current;
  const std::uint64_t held = next.*field;
  NEURON_CHECK(delta >= 0 || static_cast<std::uint64_t>(-delta) <= held,
               "device memory: ", name, " ", -delta, " bytes but only ", held, " are ",
               level);
  next.*field = held + delta;
  NEURON_CHECK(next.reserved >= next.allocated, "device memory: ", name, " would leave ",
               next.allocated, " bytes allocated in ", next.reserved, " reserved");
  NEURON_CHECK(next.allocated >= next.active, "device memory: ", name, " would leave ",
               next.active, " bytes active of ", next.allocated, " allocated");
  state_.current = next;
  RaiseTo(state_.peak, next);
  if (!state_.phase.empty()) RaiseTo(state_.phases[state_.phase], next);
}

void MemoryCounters::Reserve(std::uint64_t bytes) {
  Update(&MemoryLevels::reserved, static_cast<std::int64_t>(bytes), "reserve",
         "reserved");
}
void MemoryCounters::Release(std::uint64_t bytes) {
  Update(&MemoryLevels::reserved, -static_cast<std::int64_t>(bytes), "release",
         "reserved");
}
void MemoryCounters::Allocate(std::uint64_t bytes) {
  Update(&MemoryLevels::allocated, static_cast<std::int64_t>(bytes), "allocate",
         "allocated");
}
void MemoryCounters::Free(std::uint64_t bytes) {
  Update(&MemoryLevels::allocated, -static_cast<std::int64_t>(bytes), "free",
         "allocated");
}
void MemoryCounters::Activate(std::uint64_t bytes) {
  Update(&MemoryLevels::active, static_cast<std::int64_t>(bytes), "activate", "active");
}
void MemoryCounters::Deactivate(std::uint64_t bytes) {
  Update(&MemoryLevels::active, -static_cast<std::int64_t>(bytes), "deactivate",
         "active");
}

MemorySnapshot MemoryCounters::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

void MemoryCounters::ResetPeaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.peak = state_.current;
  for (auto& [name, levels] : state_.phases) levels = state_.current;
}

}  // namespace neuron::runtime
