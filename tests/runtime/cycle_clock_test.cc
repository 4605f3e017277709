// CycleClock: the per-operation wall clock agrees with steady_clock.
#include "neuron/runtime/cycle_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace neuron::runtime {
namespace {

TEST(CycleClock, MeasuresAnIntervalAsSteadyClockDoes) {
  CycleClock::Now();  // the first call calibrates, for 2 ms
  using Steady = std::chrono::steady_clock;
  auto us = [](Steady::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  for (int ms : {5, 30}) {
    // Each cycle reading between two steady ones: the cycle interval lies
    // between the inner and the outer steady interval (calibration aside).
    const auto outer_start = Steady::now();
    const std::int64_t start = CycleClock::Now();
    const auto inner_start = Steady::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const auto inner_end = Steady::now();
    const std::int64_t end = CycleClock::Now();
    const auto outer_end = Steady::now();
    const double cycle = CycleClock::Micros(end - start);
    const double slack = 0.002 * us(outer_end - outer_start);  // the calibration's error
    EXPECT_GE(cycle, us(inner_end - inner_start) - slack) << "slept " << ms << " ms";
    EXPECT_LE(cycle, us(outer_end - outer_start) + slack) << "slept " << ms << " ms";
    EXPECT_GE(cycle, ms * 1000.0 - slack);
  }
}

}  // namespace
}  // namespace neuron::runtime
