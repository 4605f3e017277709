// A cheap wall clock for per-operation timing: the CPU's time-stamp counter
// where it ticks at a constant rate (x86 "constant_tsc" and "nonstop_tsc")
// and the kernel uses it as its clock source, else std::chrono::steady_clock. As Abseil's CycleClock: ~10 ns a read on
// this machine against ~24 ns for steady_clock::now(), which every
// collective reads twice.
//
// Usage:
//   const auto start = CycleClock::Now();
//   ...
//   double us = CycleClock::Micros(CycleClock::Now() - start);
#pragma once

#include <cstdint>

namespace neuron::runtime {

class CycleClock {
 public:
  // Ticks since an arbitrary origin; only differences mean anything.
  static std::int64_t Now();
  // Microseconds in `ticks` (calibrated once against steady_clock, over
  // 2 ms, at the first call of Now or Micros in the process).
  static double Micros(std::int64_t ticks);
};

}  // namespace neuron::runtime
