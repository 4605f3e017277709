#include "neuron/aten/memory_trace.h"

#include <algorithm>
#include <chrono>

namespace neuron::aten {

const char* TraceActionName(TraceAction action) {
  switch (action) {
    case TraceAction::kAlloc: return "alloc";
    case TraceAction::kFreeRequested: return "free_requested";
    case TraceAction::kFreeCompleted: return "free_completed";
    case TraceAction::kSegmentAlloc: return "segment_alloc";
    case TraceAction::kSegmentFree: return "segment_free";
    case TraceAction::kOom: return "oom";
  }
  return "alloc";
}

void MemoryTrace::Enable(std::size_t max_entries) {
  max_entries_ = std::max<std::size_t>(1, max_entries);
  while (entries_.size() > max_entries_) entries_.pop_front();
}

void MemoryTrace::Disable() {
  max_entries_ = 0;
  entries_.clear();
}

void MemoryTrace::Record(TraceEntry entry) {
  if (max_entries_ == 0) return;
  entry.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  if (entries_.size() == max_entries_) entries_.pop_front();
  entries_.push_back(entry);
}

}  // namespace neuron::aten
