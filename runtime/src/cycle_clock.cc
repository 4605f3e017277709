#include "neuron/runtime/cycle_clock.h"

#include <chrono>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace neuron::runtime {

namespace {

using Steady = std::chrono::steady_clock;

// Whether the time-stamp counter runs at a constant rate, in every power
// state (else frequency changes would skew durations).
bool ConstantRateCounter() {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}

struct Calibration {
  bool counter = false;
  double micros_per_tick = 1e-3;  // steady_clock's nanoseconds otherwise
};

const Calibration& Calibrated() {
  static const Calibration c = [] {
    Calibration out;
#if defined(__x86_64__)
    out.counter = ConstantRateCounter();
    if (out.counter) {
      const auto t0 = Steady::now();
      const std::int64_t c0 = static_cast<std::int64_t>(__rdtsc());
      Steady::time_point t1;
      do {
        t1 = Steady::now();
      } while (t1 - t0 < std::chrono::milliseconds(1));
      const std::int64_t c1 = static_cast<std::int64_t>(__rdtsc());
      const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
      if (c1 > c0) {
        out.micros_per_tick = us / static_cast<double>(c1 - c0);
      } else {
        out.counter = false;
      }
    }
#endif
    return out;
  }();
  return c;
}

}  // namespace

std::int64_t CycleClock::Now() {
#if defined(__x86_64__)
  if (Calibrated().counter) return static_cast<std::int64_t>(__rdtsc());
#endif
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch())
      .count();
}

double CycleClock::Micros(std::int64_t ticks) {
  return static_cast<double>(ticks) * Calibrated().micros_per_tick;
}

}  // namespace neuron::runtime
