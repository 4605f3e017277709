// Peaks of one device's memory per phase of a program (weights load,
// compile, warm-up, steady step, ...), which the program names
// (torch.neuron.memory_phase("warmup") from Python).
//
// Usage (under the owner's lock; the class itself is not thread-safe):
//   MemoryPhases phases;
//   std::string before = phases.Enter("load", now);   // "" when there was none
//   phases.Raise(now);                                 // after every increase
//   for (const PhasePeak& p : phases.Peaks()) ...      // in order of first entry
//
// A phase's peaks start at the levels of the moment it is first entered and
// rise with every later Raise while it is current; entering it again keeps
// its peaks and raises them to the levels of that moment. An empty name
// leaves every phase: later changes count towards none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::aten {

// Bytes with torch.cuda.memory_stats()'s meanings (allocated_bytes,
// reserved_bytes, active_bytes, all pools).
struct MemoryLevels {
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
  std::uint64_t active = 0;
};

struct PhasePeak {
  std::string phase;
  MemoryLevels peak;
};

class MemoryPhases {
 public:
  // Makes `phase` current (empty: none) and returns the previous one.
  std::string Enter(const std::string& phase, const MemoryLevels& now);
  // Raises the current phase's peaks to `now` (nothing when there is none).
  void Raise(const MemoryLevels& now) {
    if (current_ >= 0) RaiseTo(peaks_[static_cast<std::size_t>(current_)].peak, now);
  }
  const std::vector<PhasePeak>& Peaks() const { return peaks_; }
  std::string Current() const;

 private:
  static void RaiseTo(MemoryLevels& peak, const MemoryLevels& now);

  std::vector<PhasePeak> peaks_;  // few phases: a linear search finds one
  int current_ = -1;              // index into peaks_, -1: none
};

}  // namespace neuron::aten
