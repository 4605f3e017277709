// Runs `body(pg, rank)` on `size` threads, each holding rank `rank` of one
// neuron process group created over a shared c10d::HashStore; rethrows the
// first exception a rank threw, after every thread finished.
#pragma once

#include <functional>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "../collectives/rank_threads.h"
#include "neuron/c10d/process_group_neuron.h"

namespace neuron::c10d::testing {

inline void RunGroup(int size, const std::function<void(ProcessGroupNeuron&, int)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = c10::make_intrusive<::c10d::HashStore>();
  collectives::testing::RunThreads(size, [&](int r) {
    ProcessGroupNeuronOptions options;
    options.timeout = timeout;
    options.group_name = "test";
    auto pg = c10::make_intrusive<ProcessGroupNeuron>(store, r, size, options);
    body(*pg, r);
  });
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
