// The allocation history of one device, in torch.cuda.memory._snapshot()'s
// "device_traces" terms (torch.neuron.memory._record_memory_history):
// alloc, free_requested, free_completed, segment_alloc, segment_free, oom.
//
// Usage (under the owner's lock; the class itself is not thread-safe):
//   MemoryTrace trace;
//   trace.Enable(1000);                    // keeps the last 1000 entries
//   if (trace.enabled()) trace.Record({TraceAction::kAlloc, addr, size, stream});
//   std::vector<TraceEntry> e = trace.Entries();   // oldest first
//   trace.Disable();                       // stops and forgets
#pragma once

#include <c10/core/Stream.h>

#include <cstdint>
#include <deque>
#include <vector>

namespace neuron::aten {

enum class TraceAction { kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kOom };
const char* TraceActionName(TraceAction action);

struct TraceEntry {
  TraceAction action = TraceAction::kAlloc;
  std::uintptr_t addr = 0;
  std::uint64_t size = 0;        // requested bytes (alloc, frees), segment bytes, or the OOM's
  c10::StreamId stream = 0;
  std::uint64_t device_free = 0;  // kOom: what the device had free
  std::int64_t time_us = 0;       // wall clock, microseconds since the epoch (set by Record)
};

class MemoryTrace {
 public:
  // Starts recording, keeping the last `max_entries` (at least 1).
  void Enable(std::size_t max_entries);
  // Stops recording and drops the entries.
  void Disable();
  bool enabled() const { return max_entries_ > 0; }
  void Record(TraceEntry entry);
  std::vector<TraceEntry> Entries() const { return {entries_.begin(), entries_.end()}; }

 private:
  std::size_t max_entries_ = 0;  // 0: off
  std::deque<TraceEntry> entries_;
};

}  // namespace neuron::aten
