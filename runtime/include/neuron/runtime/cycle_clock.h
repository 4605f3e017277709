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
  // Inline: a collective reads it twice, and a call costs a tenth of that.
  static std::int64_t Now() {
#if defined(__x86_64__)
    if (Rate().counter) return static_cast<std::int64_t>(__builtin_ia32_rdtsc());
#endif
    return SteadyNanos();
  }
  // Microseconds in `ticks` (calibrated once against steady_clock, over
  // 2 ms, at the first call of Now or Micros in the process).
  static double Micros(std::int64_t ticks) {
    return static_cast<double>(ticks) * Rate().micros_per_tick;
  }

 private:
  struct Calibration {
    bool counter = false;           // ticks are the time-stamp counter's
    double micros_per_tick = 1e-3;  // steady_clock's nanoseconds otherwise
  };
  static const Calibration& Rate() {
    static const Calibration rate = Calibrate();
    return rate;
  }
  static Calibration Calibrate();
  static std::int64_t SteadyNanos();
};

}  // namespace neuron::runtime
