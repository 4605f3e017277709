// Pipeline parallelism's plans: which layers each stage runs, and in what
// order each stage runs the forward and backward passes of the microbatches.
//
// Each stage runs a fixed order: its forwards in Megatron-LM's order
// (microbatches in groups of p, chunk-major within a group), a warm-up of
// forwards, then one forward and one backward at a time, then the
// remaining backwards. The orders are simulated (forward 1 time unit,
// backward 2, a task starting once its inputs exist): that checks they
// cannot deadlock with buffered sends and blocking receives, for any number
// of microbatches, and gives the bubble.
//
//   GPipe: every forward first, then the backwards (bubble (p-1)/(m+p-1)).
//   1F1B: warm-up p - s - 1 (same bubble; at most p - s microbatches'
//         activations held on stage s).
//   Interleaved 1F1B: v model chunks per stage (virtual stage c*p + s on
//         stage s), warm-up 2(p-s-1) + (v-1)p; bubble (p-1)/(v*m) of the
//         ideal when p divides m.
#pragma once

#include <string>
#include <vector>

namespace neuron::parallel {

enum class ScheduleKind { kGPipe, kOneForwardOneBackward, kInterleaved };
ScheduleKind ParseScheduleKind(const std::string& name);  // "gpipe", "1f1b", "interleaved"

struct PipelineTask {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;  // model chunk on this stage (0 unless interleaved)
  bool operator==(const PipelineTask& o) const {
    return forward == o.forward && microbatch == o.microbatch && chunk == o.chunk;
  }
};

struct PipelinePlan {
  std::vector<std::vector<PipelineTask>> order;  // per stage, in execution order
  double makespan = 0;                            // simulated, in forward units
  double ideal = 0;                               // m * v * (1 + 2) per stage
  std::vector<int> max_in_flight;                 // per stage: forwards not yet backwarded
  double bubble() const { return makespan > 0 ? 1 - ideal / makespan : 0; }
};

// Throws InvalidUsage naming the argument for stages < 1, microbatches < 1,
// chunks < 1, or chunks > 1 without kInterleaved.
PipelinePlan MakeSchedule(ScheduleKind kind, int stages, int microbatches, int chunks = 1);

// Splits consecutive layers with `costs` into `parts` contiguous ranges
// minimising the largest range's total cost (exact, by dynamic
// programming); returns the first layer of each part and then the layer
// count (parts + 1 entries). InvalidUsage if parts > layers.
std::vector<int> BalancedPartition(const std::vector<double>& costs, int parts);

}  // namespace neuron::parallel
