// The threaded multi-rank fixture: RunRanks runs `body(rank, store)` on
// `size` threads that share one in-memory store, and rethrows the first
// exception any rank threw (after every thread has finished).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "neuron/collectives/store/hash_store.h"

namespace neuron::collectives::testing {

// Runs `body(rank)` on `size` threads; rethrows the first exception any
// rank threw, after every thread has finished.
inline void RunThreads(int size, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

inline void RunRanks(int size, const std::function<void(int rank, Store& store)>& body) {
  HashStore store;
  RunThreads(size, [&](int rank) { body(rank, store); });
}

}  // namespace neuron::collectives::testing
