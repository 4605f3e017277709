// Runs one rank's part of a pipeline-parallel training step: the forwards
// and backwards of every microbatch in the order MakeSchedule gives this
// stage, activations and gradients moved with SendStageTensor /
// RecvStageTensor over the pipeline group.
//
//   PipelineEngine engine({.chunks = 1, .microbatches = 8}, chunk, loss, group);
//   at::Tensor loss = engine.Step(tokens, targets);   // defined on the last stage
//
// `chunk(c, microbatch, x)` runs model chunk c (virtual stage c*p + s) on
// `x` (the stage's input: a slice of `inputs` on virtual stage 0, else the
// previous stage's activation, which requires grad when floating point).
// `loss(y, targets)` is a microbatch's mean loss on the last virtual stage;
// each is weighted by its share of the batch, so the gradients are the whole
// batch's. With `cost`, each chunk's forward (its value in microseconds) and
// backward (twice that) are charged to this rank's simulated compute clock;
// receives join the clocks, so the step's modelled time includes the
// bubble, which stats() reports next to the schedule's. In a trace being
// recorded, each task's begin (before its receives) and the end of its
// compute (before its sends) are marked (op_trace.proto, TracePipelineMark).
#pragma once

#include <ATen/Tensor.h>

#include <functional>

#include "neuron/parallel/pipeline_schedule.h"
#include "neuron/parallel/tensor_parallel_ops.h"

namespace neuron::parallel {

struct PipelineOptions {
  int chunks = 1;  // model chunks on this stage (> 1: interleaved)
  int microbatches = 1;
  ScheduleKind schedule = ScheduleKind::kOneForwardOneBackward;
  std::int64_t batch_dim = 0;
};

struct PipelineStepStats {
  double modelled_step_us = 0;  // this rank's compute clock over the step
  double compute_us = 0;        // charged to the process's clock over the step
  double bubble = 0;            // 1 - compute / step
  double schedule_bubble = 0;   // of the schedule's own simulation
  double formula_bubble = 0;    // (p-1)/(m+p-1), interleaved (p-1)/(v m)
};

class PipelineEngine {
 public:
  using Chunk = std::function<at::Tensor(int chunk, int microbatch, const at::Tensor& x)>;
  using Loss = std::function<at::Tensor(const at::Tensor& y, const at::Tensor& targets)>;
  using Cost = std::function<double(int chunk, const at::Tensor& x)>;

  PipelineEngine(PipelineOptions options, Chunk chunk, Loss loss, GroupPtr group,
                 Cost cost = nullptr);

  // `inputs` on the first stage, `targets` on the last (others may pass
  // undefined tensors). Returns the batch's loss on the last stage.
  at::Tensor Step(const at::Tensor& inputs, const at::Tensor& targets);

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  const PipelineStepStats& stats() const { return stats_; }

 private:
  PipelineOptions options_;
  Chunk chunk_;
  Loss loss_;
  GroupPtr group_;
  Cost cost_;
  int stages_ = 1, stage_ = 0;
  std::vector<PipelineTask> order_;
  PipelineStepStats stats_;
};

}  // namespace neuron::parallel
