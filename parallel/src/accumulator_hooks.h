// Post-hooks on the gradient accumulators of leaf parameters: `on_ready(i)`
// runs once parameter i's gradient has been accumulated into its .grad
// (the gradient reducer and the sharded units react to that). The hooks
// hold the caller's state weakly; destruction removes them.
#pragma once

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <memory>
#include <vector>

namespace neuron::parallel::detail {

class AccumulatorHooks {
 public:
  AccumulatorHooks() = default;
  AccumulatorHooks(const AccumulatorHooks&) = delete;
  AccumulatorHooks& operator=(const AccumulatorHooks&) = delete;
  ~AccumulatorHooks() {
    for (std::size_t i = 0; i < accumulators_.size(); ++i) {
      accumulators_[i]->del_post_hook(keys_[i]);
    }
  }

  // `state` is locked for each call; a hook whose state is gone does nothing.
  template <typename State>
  void Add(const std::vector<at::Tensor>& params, const std::weak_ptr<State>& state,
           void (State::*on_ready)(std::size_t, const std::weak_ptr<State>&)) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
      keys_.push_back(accumulator->add_post_hook(
          std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [state, on_ready, i](const torch::autograd::variable_list& outputs,
                                   const torch::autograd::variable_list&) {
                if (auto s = state.lock()) ((*s).*on_ready)(i, state);
                return outputs;
              })));
      accumulators_.push_back(std::move(accumulator));
    }
  }

 private:
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> keys_;
};

}  // namespace neuron::parallel::detail
