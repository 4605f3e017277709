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
// state, and the kernel trusts it as its own clock source (it does not
// when the counters of a VM's or a machine's CPUs disagree).
bool TrustedCounter() {
#if defined(__x86_64__)
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  if (!(source >> name) || name != "tsc") return false;
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

#if defined(__x86_64__)
// One counter reading with the steady time at its middle; false when the
// two steady reads around it lie over 2 us apart (preempted: retry).
bool Sample(double* steady_us, std::int64_t* ticks) {
  const auto before = Steady::now();
  *ticks = static_cast<std::int64_t>(__rdtsc());
  const auto after = Steady::now();
  const double width = std::chrono::duration<double, std::micro>(after - before).count();
  *steady_us = std::chrono::duration<double, std::micro>(before.time_since_epoch()).count() +
               width / 2;
  return width < 2.0;
}
#endif

}  // namespace

// Over 2 ms between two bracketed samples: within ~1e-3 of the true rate.
CycleClock::Calibration CycleClock::Calibrate() {
  Calibration out;
#if defined(__x86_64__)
  if (!TrustedCounter()) return out;
  for (int attempt = 0; attempt < 5; ++attempt) {
    double us0 = 0, us1 = 0;
    std::int64_t c0 = 0, c1 = 0;
    if (!Sample(&us0, &c0)) continue;
    while (std::chrono::duration<double, std::micro>(Steady::now().time_since_epoch()).count() <
           us0 + 2000) {
    }
    if (!Sample(&us1, &c1) || c1 <= c0) continue;
    out.counter = true;
    out.micros_per_tick = (us1 - us0) / static_cast<double>(c1 - c0);
    break;
  }
#endif
  return out;
}

std::int64_t CycleClock::SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now().time_since_epoch())
      .count();
}

}  // namespace neuron::runtime
