// Futex wait/wake on a 32-bit word that may live in shared memory (so the
// process-shared variants, not FUTEX_PRIVATE).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace neuron::collectives::transport {

// Sleeps while *word == expected, at most `timeout`. Spurious returns happen;
// callers re-check their condition.
inline void FutexWait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                      std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts,
            nullptr, 0);
}

inline void FutexWakeAll(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

}  // namespace neuron::collectives::transport
