// Memory counters of a compiled plan's runs (Executor): reserved (arenas
// the runtime holds) >= allocated (bytes of live buffers) >= active (bytes
// of buffers the running plan uses), each with its current value and its
// peak, overall and per phase (load, compile, step, ...). "active" here is
// a subset of allocated, unlike torch.cuda's active_bytes (allocated plus
// frees waiting on streams); the "neuron" device's torch.cuda-style
// counters and Python-set phases are the CachingAllocator's
// (runtime/aten, torch.neuron.memory_stats / memory_phase_peaks).
//
// Usage:
//   MemoryCounters mem;
//   mem.SetPhase("step");
//   mem.Reserve(64 << 20);
//   mem.Allocate(12 << 20);
//   mem.Activate(8 << 20);
//   ... mem.Deactivate(8 << 20); mem.Free(12 << 20); mem.Release(64 << 20);
//   MemorySnapshot s = mem.Snapshot();   // s.peak.allocated, s.phases["step"]
//
// A change that would break reserved >= allocated >= active (or free more
// than is held) throws InvalidUsage naming the counter and both amounts.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace neuron::runtime {

struct MemoryLevels {
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  std::uint64_t active = 0;
};

struct MemorySnapshot {
  MemoryLevels current;
  MemoryLevels peak;                           // over the whole run
  std::map<std::string, MemoryLevels> phases;  // peak within each phase
  std::string phase;                           // the current one
};

class MemoryCounters {
 public:
  // Later changes count towards `phase`'s peaks (which start at the
  // current levels when the phase is entered first).
  void SetPhase(const std::string& phase);
  void Reserve(std::uint64_t bytes);
  void Release(std::uint64_t bytes);
  void Allocate(std::uint64_t bytes);
  void Free(std::uint64_t bytes);
  void Activate(std::uint64_t bytes);
  void Deactivate(std::uint64_t bytes);
  MemorySnapshot Snapshot() const;
  // Peaks back to the current levels (torch.cuda.reset_peak_memory_stats).
  void ResetPeaks();

 private:
  // Applies `delta` to one level; `name` is the call, `level` the counter.
  void Update(std::uint64_t MemoryLevels::*field, std::int64_t delta, const char* name,
              const char* level);

  mutable std::mutex mutex_;
  MemorySnapshot state_;
};

}  // namespace neuron::runtime
