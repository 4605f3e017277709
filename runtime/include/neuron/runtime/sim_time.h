// Simulated time: what the modelled Trainium2 hardware would take, as
// opposed to wall time on this CPU (see docs/architecture.md, "Two clocks").
// A typed duration, so simulated and wall time cannot be mixed by accident.
#pragma once

#include <chrono>

namespace neuron::runtime {

// Microseconds as a double: sub-nanosecond resolution over hours.
using SimDuration = std::chrono::duration<double, std::micro>;

inline SimDuration SimSeconds(double s) { return SimDuration(s * 1e6); }
inline double ToSeconds(SimDuration d) { return d.count() * 1e-6; }

}  // namespace neuron::runtime
