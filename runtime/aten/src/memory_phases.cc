#include "neuron/aten/memory_phases.h"

#include <algorithm>

namespace neuron::aten {

void MemoryPhases::RaiseTo(MemoryLevels& peak, const MemoryLevels& now) {
  peak.allocated = std::max(peak.allocated, now.allocated);
  peak.reserved = std::max(peak.reserved, now.reserved);
  peak.active = std::max(peak.active, now.active);
}

std::string MemoryPhases::Enter(const std::string& phase, const MemoryLevels& now) {
  std::string previous = Current();
  if (phase.empty()) {
    current_ = -1;
    return previous;
  }
  auto found = std::find_if(peaks_.begin(), peaks_.end(),
                            [&phase](const PhasePeak& p) { return p.phase == phase; });
  if (found == peaks_.end()) found = peaks_.insert(peaks_.end(), PhasePeak{phase, now});
  current_ = static_cast<int>(found - peaks_.begin());
  RaiseTo(found->peak, now);
  return previous;
}

std::string MemoryPhases::Current() const {
  return current_ < 0 ? std::string() : peaks_[static_cast<std::size_t>(current_)].phase;
}

}  // namespace neuron::aten
