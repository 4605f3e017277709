// The state of a backend's coalescing window (coalescing.cc).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "neuron/c10d/backend_neuron.h"
#include "neuron_work.h"
#include "tensor_buffers.h"

namespace neuron::c10d {

struct BackendNeuron::Coalescing {
  struct Held {
    bool send = false;
    at::Tensor input;  // a send's contiguous input
    Output output;     // a receive's staging buffer
    int peer = 0;
    int tag = 0;
    c10::intrusive_ptr<NeuronWork> work;
  };
  std::mutex mutex;
  bool active = false;
  std::vector<Held> held;
  std::uint64_t collectives_before = 0;  // the collectives' sequence at start
};

}  // namespace neuron::c10d
