// Runs `body(pg, rank)` on `size` threads, each holding rank `rank` of one
// neuron process group created over a shared c10d::HashStore; rethrows the
// first exception a rank threw, after every thread finished.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "neuron/c10d/process_group_neuron.h"

namespace neuron::c10d::testing {

inline void RunGroup(int size, const std::function<void(ProcessGroupNeuron&, int)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  std::vector<std::thread> threads;
  std::exception_ptr first;
  std::mutex mutex;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupNeuronOptions options;
        options.timeout = timeout;
        options.group_name = "test";
        auto pg = c10::make_intrusive<ProcessGroupNeuron>(store, r, size, options);
        body(*pg, r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Waits for `work` and returns its error message ("" when it succeeded).
inline std::string ErrorOf(const c10::intrusive_ptr<::c10d::Work>& work) {
  try {
    work->wait();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace neuron::c10d::testing
