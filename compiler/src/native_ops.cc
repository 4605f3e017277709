#include "neuron/compiler/native_ops.h"

#include <iterator>
#include <string>
#include <unordered_map>

#include "neuron/runtime/device/op_support.h"
#include "op_lowerings.h"

namespace neuron::compiler {

namespace {

// The table: one row per IR op the device runs.
const NativeOp kNativeOps[] = {
    // Matmuls: into PSUM (float32), then to SBUF.
    {"aten.mm", "tensor", "[M,K] x [K,N]", LowerMatmul},
    {"aten.addmm", "tensor",
     "alpha and beta 1; the bias [N] or [M,N] added on the vector engine", LowerMatmul},
    {"aten.bmm", "tensor", "[B,M,K] x [B,K,N]", LowerMatmul},
    // Elementwise.
    {"aten.add", "vector",
     "alpha 1; the second operand repeats when smaller (a bias); or a number",
     LowerArithmetic},
    {"aten.sub", "vector", "as aten.add", LowerArithmetic},
    {"aten.mul", "vector", "the second operand repeats when smaller; or a number",
     LowerArithmetic},
    {"aten.div", "vector", "as aten.mul", LowerArithmetic},
    {"aten.add.Scalar", "vector", "", LowerArithmetic},
    {"aten.sub.Scalar", "vector", "", LowerArithmetic},
    {"aten.mul.Scalar", "vector", "", LowerArithmetic},
    {"aten.div.Scalar", "vector", "", LowerArithmetic},
    {"aten.maximum", "vector", "as aten.mul", LowerBinary},
    {"aten.minimum", "vector", "as aten.mul", LowerBinary},
    {"aten.relu", "vector", "", LowerUnary},
    {"aten.neg", "vector", "", LowerUnary},
    {"aten.abs", "vector", "", LowerUnary},
    {"aten.sgn", "vector", "float (abs's gradient)", LowerUnary},
    {"aten.sign", "vector", "float", LowerUnary},
    {"aten.threshold_backward", "vector", "", LowerThresholdBackward},
    {"aten.clamp", "vector", "number bounds (either may be absent)", LowerClamp},
    {"aten.clamp_min", "vector", "a number", LowerClamp},
    {"aten.clamp_max", "vector", "a number", LowerClamp},
    {"aten.hardtanh", "vector", "(ReLU6: 0 and 6)", LowerClamp},
    {"aten.hardtanh_backward", "vector",
     "(grad, input): two threshold_backward steps; a NaN input's gradient is 0 "
     "(PyTorch's passes the gradient)",
     LowerClamp},
    {"aten.gelu_backward", "vector", "approximate \"none\" or \"tanh\"",
     LowerGeluBackward},
    {"aten.tanh_backward", "vector", "(grad, output)", LowerBinary},
    {"aten.sigmoid_backward", "vector", "(grad, output)", LowerBinary},
    {"aten.masked_fill.Scalar", "vector", "a bool or uint8 mask, repeating when smaller",
     LowerMaskedFill},
    {"aten.eq", "vector", "float operands (or a number) -> bool", LowerCompare},
    {"aten.ne", "vector", "as aten.eq", LowerCompare},
    {"aten.lt", "vector", "as aten.eq", LowerCompare},
    {"aten.le", "vector", "as aten.eq", LowerCompare},
    {"aten.gt", "vector", "as aten.eq", LowerCompare},
    {"aten.ge", "vector", "as aten.eq", LowerCompare},
    {"aten.eq.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.ne.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.lt.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.le.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.gt.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.ge.Scalar", "vector", "as aten.eq", LowerCompare},
    {"aten.where.self", "vector", "a bool condition, float operands", LowerWhere},
    {"aten.exp", "scalar", "", LowerUnary},
    {"aten.sqrt", "scalar", "", LowerUnary},
    {"aten.rsqrt", "scalar", "", LowerUnary},
    {"aten.tanh", "scalar", "", LowerUnary},
    {"aten.sigmoid", "scalar", "", LowerUnary},
    {"aten.gelu", "scalar", "approximate \"none\" or \"tanh\"", LowerUnary},
    // Row-wise over the last dimension.
    {"aten._softmax", "scalar", "over the last dimension", LowerRowwise},
    {"aten._log_softmax", "scalar", "over the last dimension", LowerRowwise},
    {"aten._softmax_backward_data", "scalar", "over the last dimension", LowerRowwise},
    {"aten._log_softmax_backward_data", "scalar", "over the last dimension",
     LowerRowwise},
    {"aten.native_layer_norm", "vector", "over the last dimension, with weight and bias",
     LowerLayerNorm},
    {"aten.native_layer_norm_backward", "vector",
     "over the last dimension, with weight and bias; all three gradients computed",
     LowerLayerNorm},
    {"aten.nll_loss_forward", "vector", "[N,C], no class weights; any reduction",
     LowerNllLoss},
    {"aten.nll_loss_backward", "vector", "[N,C], no class weights; any reduction",
     LowerNllLoss},
    {"aten.sum", "vector", "", LowerSum},
    {"aten.sum.dim_IntList", "vector", "any dims (moved to the front by a strided copy)",
     LowerSum},
    {"aten.mean", "vector", "float32, bfloat16, float16", LowerSum},
    {"aten.mean.dim", "vector", "any dims, as aten.sum.dim_IntList", LowerSum},
    // Scans along one dimension.
    {"aten.cumsum", "vector",
     "any dim; float32, bfloat16, float16 kept (no dtype change); summed in order, "
     "as eager on the CPU",
     LowerCumsum},
    {"aten.flip", "vector", "any dims, any dtype (a pass per flipped dim)", LowerFlip},
    // Data movement: strided copies of raw elements, bitwise.
    {"aten.view", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten._unsafe_view", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.reshape", "vector", "", LowerCopy},
    {"aten._reshape_alias", "vector", "", LowerCopy},
    {"aten.detach", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.clone", "vector", "contiguous result", LowerCopy},
    {"aten.alias", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.unsqueeze", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.squeeze", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.squeeze.dim", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.squeeze.dims", "vector", "", LowerCopy, OpTrait::kSameBytes},
    {"aten.t", "vector", "2-D", LowerTranspose2d, OpTrait::kLayout},
    {"aten.transpose.int", "vector", "", LowerView, OpTrait::kLayout},
    {"aten.permute", "vector", "", LowerView, OpTrait::kLayout},
    {"aten.expand", "vector", "", LowerView, OpTrait::kSameBytes},
    {"aten.select.int", "vector", "", LowerView},
    {"aten.slice", "vector", "step >= 1", LowerView},
    {"aten.unbind.int", "vector", "", LowerView},
    {"aten.stack", "vector", "", LowerView},
    {"aten.cat", "vector", "", LowerView},
    {"aten.slice_backward", "vector", "", LowerFill},
    {"aten.select_backward", "vector", "", LowerFill},
    {"aten.embedding", "gpsimd", "int32 or int64 indices", LowerIndexing},
    {"aten.convolution", "tensor",
     "2-D, groups 1, not transposed: im2col on GpSimd, a matmul (the bias added leaving "
     "PSUM)",
     LowerWindows},
    {"aten.convolution_backward", "tensor", "as aten.convolution; col2im on GpSimd",
     LowerWindows},
    {"aten.max_pool2d_with_indices", "gpsimd", "no ceil_mode", LowerWindows},
    {"aten.max_pool2d_with_indices_backward", "gpsimd", "no ceil_mode", LowerWindows},
    {"aten.native_dropout", "gpsimd",
     "the mask from a hash of (the run's seed, drawn from torch's generator; the site; "
     "the element)",
     LowerDropout, OpTrait::kRandom},
    {"aten.native_dropout_backward", "gpsimd", "", LowerDropout},
    {"aten.bernoulli_.float", "gpsimd",
     "as aten.native_dropout's mask (functional on the device)", LowerDropout,
     OpTrait::kRandom},
    {"aten.bernoulli.p", "gpsimd", "as aten.bernoulli_.float", LowerDropout,
     OpTrait::kRandom},
    {"aten.embedding_dense_backward", "gpsimd",
     "padding_idx honoured; no scale_grad_by_freq", LowerIndexing},
    // Constants.
    {"aten.zeros", "vector", "", LowerFill},
    {"aten.ones", "vector", "", LowerFill},
    {"aten.full", "vector", "", LowerFill},
    {"aten.zeros_like", "vector", "", LowerFill},
    {"aten.ones_like", "vector", "", LowerFill},
    {"aten.full_like", "vector", "", LowerFill},
    {"aten.new_zeros", "vector", "", LowerFill},
    {"aten.new_ones", "vector", "", LowerFill},
    {"aten.new_full", "vector", "", LowerFill},
    {"aten.empty_like", "vector", "filled with zeros", LowerFill},
    {"aten.empty", "vector", "filled with zeros", LowerFill},
    {"aten.arange", "gpsimd", "", LowerIndexing},
    {"aten.arange.start", "gpsimd", "", LowerIndexing},
    {"aten.arange.start_step", "gpsimd", "", LowerIndexing},
};

}  // namespace

const char* Name(OpTrait trait) {
  switch (trait) {
    case OpTrait::kNone:
      return "";
    case OpTrait::kRandom:
      return "random";
    case OpTrait::kSameBytes:
      return "same_bytes";
    case OpTrait::kLayout:
      return "layout";
  }
  return "";
}

const std::vector<NativeOp>& NativeOps() {
  static const std::vector<NativeOp> ops(std::begin(kNativeOps), std::end(kNativeOps));
  return ops;
}

const NativeOp* FindNativeOp(const std::string& name) {
  static const std::unordered_map<std::string, const NativeOp*> by_name = [] {
    std::unordered_map<std::string, const NativeOp*> out;
    for (const auto& op : NativeOps()) out.emplace(op.name, &op);
    return out;
  }();
  auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

bool IsNativeOp(const std::string& name) { return FindNativeOp(name) != nullptr; }

std::string SupportKey(const std::string& name) {
  std::string base = name;
  const auto dot = base.find('.');
  if (dot != std::string::npos) base = base.substr(dot + 1);  // the namespace
  base = base.substr(0, base.find('.'));                      // the overload
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') base.pop_back();
  return base;
}

std::string NotNativeReason(const std::string& name) {
  const runtime::OpSupport& row = runtime::SupportOf(SupportKey(name));
  if (row.support == runtime::Support::kUnsupported) {
    return std::string("unsupported: ") + row.note;
  }
  if (row.support == runtime::Support::kCpuFallback) {
    return std::string("a CPU fallback: ") + row.note;
  }
  return std::string("eager runs it as ") + runtime::Name(row.support) +
         "; the compiler has no lowering for it";
}

}  // namespace neuron::compiler
