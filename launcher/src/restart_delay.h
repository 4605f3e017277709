// The back-off between a failed attempt and its restart (--max-restarts):
// kInitialRestartDelay before the first restart, doubling each time, at
// most kMaxRestartDelay, so a job that fails at once does not spin.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace neuron::launcher {

inline constexpr std::chrono::milliseconds kInitialRestartDelay{500};
inline constexpr std::chrono::milliseconds kMaxRestartDelay{30000};

// The wait before restart `restart` (1 for the first).
inline std::chrono::milliseconds RestartDelay(std::uint32_t restart) {
  std::chrono::milliseconds delay = kInitialRestartDelay;
  for (std::uint32_t i = 1; i < restart && delay < kMaxRestartDelay; ++i) delay *= 2;
  return std::min(delay, kMaxRestartDelay);
}

}  // namespace neuron::launcher
