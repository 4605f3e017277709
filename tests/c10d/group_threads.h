// Runs `body(backend, rank)` on `size` threads, each holding rank `rank` of
// one neuron backend created over a shared c10d::HashStore; rethrows the
// first exception a rank threw, after every thread finished. RunProcessGroup
// hands each rank a c10d::ProcessGroup over its backend instead (c10d's
// dispatched ops, as libtorch code and torch.distributed call them).
#pragma once

#include <functional>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "../collectives/rank_threads.h"
#include "neuron/c10d/backend_neuron.h"

namespace neuron::c10d::testing {

// Runs `body(backend, store, rank)` on `size` threads over one HashStore.
inline void RunBackends(
    int size, std::chrono::milliseconds timeout,
    const std::function<void(c10::intrusive_ptr<BackendNeuron>,
                             const c10::intrusive_ptr<::c10d::Store>&, int)>& body) {
  c10::intrusive_ptr<::c10d::Store> store = c10::make_intrusive<::c10d::HashStore>();
  collectives::testing::RunThreads(size, [&](int r) {
    BackendNeuronOptions options;
    options.timeout = timeout;
    options.group_name = "test";
    body(c10::make_intrusive<BackendNeuron>(store, r, size, options), store, r);
  });
}

inline void RunGroup(int size, const std::function<void(BackendNeuron&, int)>& body,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  RunBackends(size, timeout, [&](auto backend, const auto&, int r) { body(*backend, r); });
}

inline void RunProcessGroup(int size,
                            const std::function<void(::c10d::ProcessGroup&, int)>& body,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  RunBackends(size, timeout, [&](auto backend, const auto& store, int r) {
    body(*MakeProcessGroup(store, std::move(backend)), r);
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
