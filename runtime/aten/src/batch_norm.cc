// Batch norm on "neuron" with an accelerator's dtype rules: any mix of
// parameter and statistic dtypes.
//
// The CPU's kernel takes parameters of the input's dtype, or (a bf16/fp16
// input) parameters that are all fp32; any other mix raises "expected
// scalar type BFloat16 but found Float". CUDA's takes any mix: it computes
// in the input's accumulation type (fp32 for bf16, fp16 and fp32 input),
// returns the output in the input's dtype, updates the running statistics
// in their own dtype and returns gradients in their parameters' dtypes.
// FSDP2's mixed precision relies on it: it casts a BatchNorm's weight and
// input to bf16 and leaves the running statistics in fp32.
//
// "neuron" gives CUDA's rule. A mix the CPU's kernel takes runs as it is
// (the same bits as before); any other mix runs the CPU's kernel with every
// parameter and statistic in the accumulation type (copies), writes the
// updated statistics back into their own tensors, and casts the gradients
// of the weight and bias to the weight's dtype.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <tuple>

#include "neuron/aten/cpu_fallback.h"

namespace neuron::aten {
namespace {

using at::Tensor;
using OptionalTensor = std::optional<Tensor>;

// The dtype the CPU's kernel computes a mix in: fp32 for reduced and fp32
// inputs, the input's own otherwise (float64).
c10::ScalarType AccumulationType(const Tensor& input) {
  const auto dtype = input.scalar_type();
  return c10::isReducedFloatingType(dtype) ? c10::ScalarType::Float : dtype;
}

bool Defined(const OptionalTensor& t) { return t.has_value() && t->defined(); }

// True when the CPU's kernel accepts `params` beside `input` as they are:
// every defined one of the input's dtype, or all fp32 beside a reduced input.
bool CpuAccepts(const Tensor& input, std::initializer_list<const OptionalTensor*> params) {
  std::optional<c10::ScalarType> common;
  for (const OptionalTensor* p : params) {
    if (!Defined(*p)) continue;
    if (common && *common != (*p)->scalar_type()) return false;
    common = (*p)->scalar_type();
  }
  if (!common || *common == input.scalar_type()) return true;
  return c10::isReducedFloatingType(input.scalar_type()) && *common == c10::ScalarType::Float;
}

OptionalTensor Cast(const OptionalTensor& t, c10::ScalarType dtype) {
  if (!Defined(t) || (*t).scalar_type() == dtype) return t;
  return (*t).to(dtype);
}

// Runs `name`'s CPU kernel (through the device's fallback: costed and
// recorded as that op) on boxed arguments; returns the stack of results.
template <typename... Args>
torch::jit::Stack RunCpuKernel(const char* name, Args&&... args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (torch::jit::push_one(stack, std::forward<Args>(args)), ...);
  CpuFallback(op, &stack);
  return stack;
}

using Triple = std::tuple<Tensor, Tensor, Tensor>;

Triple PopTriple(torch::jit::Stack stack) {
  return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
}

// A running statistic in the accumulation type; written back by Commit.
class Statistic {
 public:
  Statistic(const OptionalTensor& original, c10::ScalarType dtype)
      : original_(original), working_(Cast(original, dtype)) {}
  const OptionalTensor& working() const { return working_; }
  void Commit() const {
    if (Defined(original_) && !working_->is_same(*original_)) original_->copy_(*working_);
  }

 private:
  OptionalTensor original_;
  OptionalTensor working_;
};

Triple NativeBatchNorm(const Tensor& input, const OptionalTensor& weight,
                       const OptionalTensor& bias, const OptionalTensor& running_mean,
                       const OptionalTensor& running_var, bool training, double momentum,
                       double eps) {
  constexpr const char* kOp = "aten::native_batch_norm";
  if (CpuAccepts(input, {&weight, &bias, &running_mean, &running_var})) {
    return PopTriple(RunCpuKernel(kOp, input, weight, bias, running_mean, running_var, training,
                                  momentum, eps));
  }
  const auto acc = AccumulationType(input);
  const Statistic mean(running_mean, acc);
  const Statistic var(running_var, acc);
  Triple out = PopTriple(RunCpuKernel(kOp, input, Cast(weight, acc), Cast(bias, acc),
                                      mean.working(), var.working(), training, momentum, eps));
  if (training) {
    mean.Commit();
    var.Commit();
  }
  return out;
}

Triple NativeBatchNormBackward(const Tensor& grad_out, const Tensor& input,
                               const OptionalTensor& weight, const OptionalTensor& running_mean,
                               const OptionalTensor& running_var, const OptionalTensor& save_mean,
                               const OptionalTensor& save_invstd, bool train, double eps,
                               std::array<bool, 3> output_mask) {
  constexpr const char* kOp = "aten::native_batch_norm_backward";
  if (CpuAccepts(input, {&weight, &running_mean, &running_var, &save_mean, &save_invstd})) {
    return PopTriple(RunCpuKernel(kOp, grad_out, input, weight, running_mean, running_var,
                                  save_mean, save_invstd, train, eps, output_mask));
  }
  const auto acc = AccumulationType(input);
  auto [grad_input, grad_weight, grad_bias] = PopTriple(RunCpuKernel(
      kOp, grad_out, input, Cast(weight, acc), Cast(running_mean, acc), Cast(running_var, acc),
      Cast(save_mean, acc), Cast(save_invstd, acc), train, eps, output_mask));
  if (Defined(weight)) {
    const auto dtype = weight->scalar_type();
    if (grad_weight.defined()) grad_weight = grad_weight.to(dtype);
    if (grad_bias.defined()) grad_bias = grad_bias.to(dtype);
  }
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_batch_norm", TORCH_FN(NativeBatchNorm));
  m.impl("native_batch_norm_backward", TORCH_FN(NativeBatchNormBackward));
}

}  // namespace neuron::aten
