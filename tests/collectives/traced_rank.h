// One rank of a threaded test job whose operations are traced
// (runtime/op_trace.h): its own simulated clock records into `trace`, and
// `world` is its communicator of the whole job on that clock.
#pragma once

#include <memory>

#include "neuron/collectives/communicator.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives::testing {

struct TracedRank {
  TracedRank(Store& store, int rank, int size) {
    clock->set_trace(trace);
    CommunicatorOptions options;
    options.clock = clock;
    world = std::make_unique<Communicator>(std::shared_ptr<Store>(&store, [](Store*) {}),
                                           rank, size, options);
  }

  std::shared_ptr<runtime::SimClock> clock = std::make_shared<runtime::SimClock>();
  std::shared_ptr<runtime::OpTrace> trace = std::make_shared<runtime::OpTrace>();
  std::unique_ptr<Communicator> world;
};

}  // namespace neuron::collectives::testing
