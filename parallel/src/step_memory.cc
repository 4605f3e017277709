#include "neuron/parallel/step_memory.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

ParameterBytes BytesPerParameter(const std::string& dtype) {
  if (dtype == "bf16-mixed") return {2, 12, 4};  // fp32 master, m, v; fp32 accumulation
  if (dtype == "bf16") return {2, 4, 2};         // pure bf16 (stochastic rounding)
  if (dtype == "fp32") return {4, 8, 4};
  throw InvalidUsage(StrCat("dtype must be bf16-mixed, bf16 or fp32, got \"", dtype, "\""));
}

StepMemory EstimateStepMemory(const proto::StepCapture& capture, const MemoryLayout& layout,
                              int stage) {
  NEURON_CHECK(stage >= 0 && stage < capture.stage_parameters_size(), "memory: stage ", stage,
               " of ", capture.stage_parameters_size());
  NEURON_CHECK(layout.ep >= 1 && std::max(1, layout.dp) % layout.ep == 0, "memory: ep ",
               layout.ep, " does not divide dp ", layout.dp);
  const ParameterBytes b = BytesPerParameter(layout.dtype);
  const double p = static_cast<double>(capture.stage_parameters(stage));
  const double experts = stage < capture.stage_expert_parameters_size()
                             ? static_cast<double>(capture.stage_expert_parameters(stage))
                             : 0;
  // The dense parameters shard over every dp rank, the experts over their replicas.
  const double dp = std::max(1, layout.dp), replicas = dp / layout.ep;
  auto sharded = [&](double bytes, bool shard) {
    return shard ? (p - experts) * bytes / dp + experts * bytes / replicas : p * bytes;
  };
  StepMemory m;
  m.weights_and_optimizer =
      sharded(b.weights, layout.zero >= 3) + sharded(b.optimizer, layout.zero >= 1);
  m.gradients = sharded(b.gradients, layout.zero >= 2);
  const bool first = stage == 0, last = stage == layout.pp - 1;
  const double per_microbatch =
      layout.stage_layers * static_cast<double>(capture.layer_activation_bytes()) +
      (first ? capture.embed_activation_bytes() : 0) +
      (last ? capture.head_activation_bytes() : 0);
  const int in_flight = std::min(layout.microbatches, layout.pp - stage);
  m.activations = per_microbatch * in_flight;
  m.communication = (layout.dp > 1 ? 2 * std::min(layout.bucket_bytes, p * b.gradients) : 0) +
                    (layout.pp > 1 ? 2 * layout.message_bytes : 0);
  return m;
}

}  // namespace neuron::parallel
