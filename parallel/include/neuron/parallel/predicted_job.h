// The operation traces of a predicted training step (docs/scaling.md,
// "Predicting a full-size job"): the priced phases of a captured step
// (step_pricing.h) laid out as the ranks of a tp x pp x dp job run them,
// for runtime::ReplayTraces to compose over the whole cluster.
//
// Each rank runs its pipeline stage's 1F1B order (parallel::MakeSchedule)
// over the step's microbatches: a forward receives its input from the
// previous stage, runs the stage's phases (the embedding on the first
// stage, its decoder layers, the head and loss on the last) and sends its
// output on; a backward does the reverse. The tensor-parallel collectives
// inside a phase block the compute stream of every member alike (the
// members run the same program), so each is charged to the phase's compute
// at the fabric model's time for the group's placement (PhaseCost's
// tp_collective_us). After the last backward the gradients are reduced over
// the data-parallel group in buckets (all-reduce; reduce-scatter under
// ZeRO-1 and -2), the gradient norm is all-reduced, the optimizer phase
// runs on the rank's shard, and ZeRO-1 and -2 all-gather the updated
// parameters. ZeRO-3 instead all-gathers the stage's parameters before each
// forward and backward and reduce-scatters its gradients after each
// backward (one unit per stage, blocking, no prefetch).
//
// Expert parallelism (a Mixture of Experts, ep > 1) is carved out of the dp
// ranks: ep consecutive data-parallel ranks hold different experts and
// exchange tokens (their all-to-alls blocking inside the layer phases, as
// the tensor-parallel collectives: PhaseCost's ep_collective_us); the
// experts' gradients are reduced (and under ZeRO sharded) over the dp / ep
// ranks that hold the same experts, every other gradient over all dp. Both
// go through one data-parallel stream, the experts' after the rest.
//
// The traces hold min(dp / ep, 2) replicas of ep x tp ranks each:
// ReplayTraces runs the recorded replicas' programs on every replica of
// the target (their layout counts the ep x tp ranks as its tp positions,
// op_trace.proto's TraceLayout).
//
// Usage:
//   PredictedLayout layout{.tp = 8, .pp = 1, .dp = 64, .microbatches = 16, ...};
//   auto traces = PredictedTraces(costs, capture, layout);
//   ReplayResult r = ReplayTraces(traces, fabric);
#pragma once

#include <string>
#include <vector>

#include "neuron/parallel/step_capture.pb.h"
#include "neuron/parallel/step_pricing.h"
#include "neuron/runtime/op_trace.pb.h"

namespace neuron::parallel {

struct PredictedLayout {
  int tp = 1, pp = 1, dp = 1;
  int ep = 1;                     // expert parallel, of the dp ranks (divides dp)
  int microbatches = 1;           // per step, per data-parallel rank
  int zero = 0;                   // ZeRO stage: 0 all-reduces the gradients
  double gradient_bytes = 4;      // per parameter, as reduced (fp32: 4)
  double parameter_bytes = 2;     // per parameter, as ZeRO all-gathers them
  double message_bytes = 0;       // a pipeline stage's activations (and their gradients)
  double bucket_bytes = 512e6;    // data-parallel reduction buckets
  std::vector<int> stage_layers;  // decoder layers per stage (pp entries)
};

// InvalidUsage names a layout the costs cannot run: a missing phase, sizes
// < 1, ep not dividing dp, or stage_layers (or the capture's stage
// parameters) not of pp entries.
std::vector<runtime::proto::RankTrace> PredictedTraces(const StepCosts& costs,
                                                       const proto::StepCapture& capture,
                                                       const PredictedLayout& layout);

// The optimizer phase of a stage holding `parameters` (its captured name).
std::string OptimizerPhase(std::int64_t parameters);

}  // namespace neuron::parallel
