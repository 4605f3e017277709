#include "neuron/parallel/pipeline_engine.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "neuron/parallel/pipeline_p2p.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::parallel {

namespace {

// Marks where task `task` (on virtual stage `vs`) is, in the trace being
// recorded, if any.
void MarkTask(runtime::proto::TracePipelineMark::Kind kind, const PipelineTask& task,
              int vs) {
  if (const auto trace = runtime::ProcessClock()->trace()) {
    trace->Mark(runtime::TaskMark(kind, task.forward, task.microbatch, vs));
  }
}

}  // namespace

PipelineEngine::PipelineEngine(PipelineOptions options, Chunk chunk, Loss loss, GroupPtr group,
                               Cost cost)
    : options_(options), chunk_(std::move(chunk)), loss_(std::move(loss)),
      group_(std::move(group)), cost_(std::move(cost)) {
  NEURON_CHECK(group_, "pipeline engine: no pipeline group");
  stages_ = group_->getSize();
  stage_ = group_->getRank();
  const PipelinePlan plan =
      MakeSchedule(options_.schedule, stages_, options_.microbatches, options_.chunks);
  order_ = plan.order[stage_];
  stats_.schedule_bubble = plan.bubble();
  const double p = stages_, m = options_.microbatches, v = options_.chunks;
  stats_.formula_bubble = v == 1 ? (p - 1) / (m + p - 1) : (p - 1) / (v * m);
}

at::Tensor PipelineEngine::Step(const at::Tensor& inputs, const at::Tensor& targets) {
  const int p = stages_, vstages = stages_ * options_.chunks;
  const std::int64_t dim = options_.batch_dim;
  const auto clock = runtime::ProcessClock();
  const double clock0 = clock->compute().count(), charged0 = clock->charged().count();
  auto charge = [&](double us) {
    if (us > 0) clock->AdvanceCompute(runtime::SimDuration(us));
  };
  using Mark = runtime::proto::TracePipelineMark;
  std::vector<at::Tensor> micro_in, micro_t;
  if (first()) micro_in = inputs.tensor_split(options_.microbatches, dim);
  if (last()) micro_t = targets.tensor_split(options_.microbatches, dim);
  const double total = last() ? static_cast<double>(targets.size(dim)) : 1;
  struct Saved {
    at::Tensor x, y;
    double forward_us = 0;  // the backward costs twice that
  };
  std::map<std::pair<int, int>, Saved> saved;  // (microbatch, chunk)
  std::vector<c10::intrusive_ptr<::c10d::Work>> sends;
  auto send = [&](const at::Tensor& t, int vs, bool gradient, int mb) {
    for (auto& w : SendStageTensor(*group_, vs % p, t, {gradient, mb, vs})) sends.push_back(w);
  };
  at::Tensor loss_sum;
  for (const PipelineTask& task : order_) {
    const int mb = task.microbatch, c = task.chunk, vs = c * p + stage_;
    MarkTask(Mark::TASK_BEGIN, task, vs);
    if (task.forward) {
      at::Tensor x;
      if (vs == 0) {
        x = micro_in[mb];
      } else {
        x = RecvStageTensor(*group_, (vs - 1) % p, {false, mb, vs}, std::nullopt);
        if (x.is_floating_point()) x.requires_grad_(true);
      }
      at::Tensor y = chunk_(c, mb, x);
      const double forward_us = cost_ ? cost_(c, x) : 0;
      charge(forward_us);
      if (vs == vstages - 1) {
        y = loss_(y, micro_t[mb]) * (static_cast<double>(micro_t[mb].size(dim)) / total);
        loss_sum = loss_sum.defined() ? loss_sum + y.detach() : y.detach();
        MarkTask(Mark::TASK_END, task, vs);
      } else {
        MarkTask(Mark::TASK_END, task, vs);
        send(y, vs + 1, false, mb);
      }
      saved[{mb, c}] = {x, y, forward_us};
    } else {
      auto node = saved.extract({mb, c});
      NEURON_ASSERT(!node.empty(), "pipeline: backward before forward");
      const Saved& task_state = node.mapped();
      const at::Tensor x = task_state.x, y = task_state.y;
      if (vs == vstages - 1) {
        torch::autograd::backward({y});
      } else {
        const at::Tensor g = RecvStageTensor(*group_, (vs + 1) % p, {true, mb, vs}, y);
        torch::autograd::backward({y}, {g});
      }
      charge(2 * task_state.forward_us);
      MarkTask(Mark::TASK_END, task, vs);
      if (vs > 0) {
        NEURON_CHECK(x.grad().defined(), "pipeline stage ", stage_, " (virtual stage ", vs,
                     "), microbatch ", mb, ", backward: the stage's input got no gradient "
                     "(does the chunk use its input?)");
        send(x.grad(), vs - 1, true, mb);
      }
    }
  }
  for (auto& w : sends) w->wait();
  stats_.modelled_step_us = clock->compute().count() - clock0;
  stats_.compute_us = clock->charged().count() - charged0;
  stats_.bubble =
      stats_.modelled_step_us > 0 ? 1 - stats_.compute_us / stats_.modelled_step_us : 0;
  return loss_sum;
}

}  // namespace neuron::parallel
