// The peak HBM of one NeuronCore in a predicted training step, by what it
// holds (docs/scaling.md, "Predicting a full-size job"):
//
//   weights and optimizer state  the stage's parameters in the compute
//                                dtype, plus the optimizer's fp32 master
//                                weights and Adam moments (bf16 moments in
//                                pure bf16), divided over the data-parallel
//                                ranks from ZeRO-1 on (ZeRO-3: the weights too);
//                                a Mixture of Experts' experts (the capture's
//                                stage_expert_parameters: experts / ep of them
//                                per rank) over their dp / ep replicas only
//   gradients                    the accumulated gradients (fp32 for
//                                bf16-mixed, as NxD accumulates them);
//                                divided over the data-parallel ranks from ZeRO-2
//                                (the experts' over their replicas)
//   activations                  what each layer keeps for backward (captured:
//                                StepCapture's *_activation_bytes) for the
//                                microbatches in flight: 1F1B holds pp - s on
//                                stage s (all of GPipe's), one without pipelining
//   communication buffers        the data-parallel reduction's bucket (twice:
//                                in flight and being filled) and the pipeline's
//                                send and receive buffers
//
// Usage:
//   StepMemory m = EstimateStepMemory(capture, {.dtype = "bf16-mixed", .zero = 1, ...}, 0);
//   if (m.total() > capacity) ...
#pragma once

#include <cstdint>
#include <string>

#include "neuron/parallel/step_capture.pb.h"

namespace neuron::parallel {

struct MemoryLayout {
  std::string dtype = "bf16-mixed";  // "bf16-mixed" | "bf16" | "fp32"
  int pp = 1, dp = 1, zero = 0;
  int ep = 1;                        // expert parallel, of the dp ranks
  int microbatches = 1;
  int stage_layers = 1;              // decoder layers on the stage
  double message_bytes = 0;          // a pipeline message
  double bucket_bytes = 512e6;       // data-parallel reduction bucket
};

struct StepMemory {
  double weights_and_optimizer = 0;
  double gradients = 0;
  double activations = 0;
  double communication = 0;
  double total() const { return weights_and_optimizer + gradients + activations + communication; }
};

// Bytes per parameter by training dtype: the weights as the model computes
// with them (and as ZeRO all-gathers them), the optimizer's state (master
// weights and Adam moments), the gradients (as accumulated and reduced).
// InvalidUsage for a dtype other than bf16-mixed, bf16 and fp32.
struct ParameterBytes {
  double weights, optimizer, gradients;
};
ParameterBytes BytesPerParameter(const std::string& dtype);

// Stage `stage`'s peak; InvalidUsage for an unknown dtype, a stage the
// capture does not have, or ep not dividing dp.
StepMemory EstimateStepMemory(const proto::StepCapture& capture, const MemoryLayout& layout,
                              int stage);

}  // namespace neuron::parallel
