// CycleClock: the per-operation wall clock agrees with steady_clock.
#include "neuron/runtime/cycle_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace neuron::runtime {
namespace {

TEST(CycleClock, MeasuresAnIntervalAsSteadyClockDoes) {
  CycleClock::Now();  // the first call calibrates, for a millisecond
  for (int ms : {5, 30}) {
    const auto steady_start = std::chrono::steady_clock::now();
    const std::int64_t start = CycleClock::Now();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    const std::int64_t end = CycleClock::Now();
    const double steady_us = std::chrono::duration<double, std::micro>(
                                 std::chrono::steady_clock::now() - steady_start).count();
    const double us = CycleClock::Micros(end - start);
    EXPECT_GE(us, ms * 1000.0) << "slept " << ms << " ms";
    // The two reads of each clock are a few hundred nanoseconds apart.
    EXPECT_NEAR(us, steady_us, steady_us * 0.01 + 5.0) << "slept " << ms << " ms";
  }
}

}  // namespace
}  // namespace neuron::runtime
