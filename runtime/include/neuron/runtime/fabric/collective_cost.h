// The modelled duration of one collective on the fabric: what a
// communicator charges its ranks' clocks, and what the trace replay
// (trace_replay.h) recomputes on another topology.
//
// Usage:
//   CollectiveCost c = ModelCollective(model, "allreduce", 64 << 20, AllRanks(16), 0);
//   c.micros, c.algorithm  // e.g. 2100.5, "rdh"
#pragma once

#include <string>
#include <vector>

#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_model.h"

namespace neuron::runtime {

struct CollectiveCost {
  double micros = 0;
  const char* algorithm = "";  // the schedule's name, e.g. "ring", "linear" (static)
  int chunks = 1;              // the pipeline's chunks (Schedule::chunks)
};

// `kind` is a CollectiveKind name ("allreduce", "allgather", "reducescatter",
// "broadcast", "reduce", "alltoall"), run with `algorithm` where it
// implements the shape and ChooseAlgorithm's choice otherwise (the cost
// names the one used), or "gather" / "scatter": linear, every other rank and
// the root at once, `bytes` each. `group` lists job ranks in communicator
// order; `root` indexes it. InvalidUsage names an unknown kind.
CollectiveCost ModelCollective(const FabricModel& model, const std::string& kind, double bytes,
                               const std::vector<int>& group, int root,
                               FabricAlgorithm algorithm = FabricAlgorithm::kAuto);

}  // namespace neuron::runtime
