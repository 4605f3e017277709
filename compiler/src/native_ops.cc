#include "neuron/compiler/native_ops.h"

#include <set>

namespace neuron::compiler {

const std::vector<NativeOp>& NativeOps() {
  static const std::vector<NativeOp> ops = {
      // Matmuls: into PSUM (float32), then to SBUF.
      {"aten.mm", "tensor", "[M,K] x [K,N]"},
      {"aten.addmm", "tensor", "alpha and beta 1; the bias [N] or [M,N] added on the vector engine"},
      {"aten.bmm", "tensor", "[B,M,K] x [B,K,N]"},
      // Elementwise.
      {"aten.add", "vector", "alpha 1; the second operand repeats when smaller (a bias); or a number"},
      {"aten.sub", "vector", "as aten.add"},
      {"aten.mul", "vector", "the second operand repeats when smaller; or a number"},
      {"aten.div", "vector", "as aten.mul"},
      {"aten.add.Scalar", "vector", ""},
      {"aten.sub.Scalar", "vector", ""},
      {"aten.mul.Scalar", "vector", ""},
      {"aten.div.Scalar", "vector", ""},
      {"aten.maximum", "vector", "as aten.mul"},
      {"aten.minimum", "vector", "as aten.mul"},
      {"aten.relu", "vector", ""},
      {"aten.neg", "vector", ""},
      {"aten.abs", "vector", ""},
      {"aten.sgn", "vector", "float (abs's gradient)"},
      {"aten.sign", "vector", "float"},
      {"aten.threshold_backward", "vector", ""},
      {"aten.gelu_backward", "vector", "approximate \"none\" or \"tanh\""},
      {"aten.tanh_backward", "vector", "(grad, output)"},
      {"aten.sigmoid_backward", "vector", "(grad, output)"},
      {"aten.masked_fill.Scalar", "vector", "a bool or uint8 mask, repeating when smaller"},
      {"aten.eq", "vector", "float operands (or a number) -> bool"},
      {"aten.ne", "vector", "as aten.eq"},
      {"aten.lt", "vector", "as aten.eq"},
      {"aten.le", "vector", "as aten.eq"},
      {"aten.gt", "vector", "as aten.eq"},
      {"aten.ge", "vector", "as aten.eq"},
      {"aten.eq.Scalar", "vector", "as aten.eq"},
      {"aten.ne.Scalar", "vector", "as aten.eq"},
      {"aten.lt.Scalar", "vector", "as aten.eq"},
      {"aten.le.Scalar", "vector", "as aten.eq"},
      {"aten.gt.Scalar", "vector", "as aten.eq"},
      {"aten.ge.Scalar", "vector", "as aten.eq"},
      {"aten.where.self", "vector", "a bool condition, float operands"},
      {"aten.exp", "scalar", ""},
      {"aten.tanh", "scalar", ""},
      {"aten.sigmoid", "scalar", ""},
      {"aten.gelu", "scalar", "approximate \"none\" or \"tanh\""},
      // Row-wise over the last dimension.
      {"aten._softmax", "scalar", "over the last dimension"},
      {"aten._log_softmax", "scalar", "over the last dimension"},
      {"aten._softmax_backward_data", "scalar", "over the last dimension"},
      {"aten._log_softmax_backward_data", "scalar", "over the last dimension"},
      {"aten.native_layer_norm", "vector", "over the last dimension, with weight and bias"},
      {"aten.native_layer_norm_backward", "vector",
       "over the last dimension, with weight and bias; all three gradients computed"},
      {"aten.nll_loss_forward", "vector", "[N,C], no class weights; any reduction"},
      {"aten.nll_loss_backward", "vector", "[N,C], no class weights; any reduction"},
      {"aten.sum", "vector", ""},
      {"aten.sum.dim_IntList", "vector", "any dims (moved to the front by a strided copy)"},
      {"aten.mean", "vector", "float32, bfloat16, float16"},
      {"aten.mean.dim", "vector", "any dims, as aten.sum.dim_IntList"},
      // Data movement: strided copies of raw elements, bitwise.
      {"aten.view", "vector", ""},
      {"aten._unsafe_view", "vector", ""},
      {"aten.reshape", "vector", ""},
      {"aten._reshape_alias", "vector", ""},
      {"aten.detach", "vector", ""},
      {"aten.clone", "vector", "contiguous result"},
      {"aten.alias", "vector", ""},
      {"aten.unsqueeze", "vector", ""},
      {"aten.squeeze", "vector", ""},
      {"aten.squeeze.dim", "vector", ""},
      {"aten.t", "vector", "2-D"},
      {"aten.transpose.int", "vector", ""},
      {"aten.permute", "vector", ""},
      {"aten.expand", "vector", ""},
      {"aten.select.int", "vector", ""},
      {"aten.slice", "vector", "step >= 1"},
      {"aten.unbind.int", "vector", ""},
      {"aten.stack", "vector", ""},
      {"aten.cat", "vector", ""},
      {"aten.slice_backward", "vector", ""},
      {"aten.select_backward", "vector", ""},
      {"aten.embedding", "gpsimd", "int32 or int64 indices"},
      {"aten.convolution", "tensor",
       "2-D, groups 1, not transposed: im2col on GpSimd, a matmul (the bias added leaving PSUM)"},
      {"aten.convolution_backward", "tensor", "as aten.convolution; col2im on GpSimd"},
      {"aten.max_pool2d_with_indices", "gpsimd", "no ceil_mode"},
      {"aten.max_pool2d_with_indices_backward", "gpsimd", "no ceil_mode"},
      {"aten.native_dropout", "gpsimd",
       "the mask from a hash of (the run's seed, drawn from torch's generator; the site; the element)"},
      {"aten.native_dropout_backward", "gpsimd", ""},
      {"aten.bernoulli_.float", "gpsimd", "as aten.native_dropout's mask (functional on the device)"},
      {"aten.bernoulli.p", "gpsimd", "as aten.bernoulli_.float"},
      {"aten.embedding_dense_backward", "gpsimd", "padding_idx honoured; no scale_grad_by_freq"},
      // Constants.
      {"aten.zeros", "vector", ""},
      {"aten.ones", "vector", ""},
      {"aten.full", "vector", ""},
      {"aten.zeros_like", "vector", ""},
      {"aten.ones_like", "vector", ""},
      {"aten.full_like", "vector", ""},
      {"aten.new_zeros", "vector", ""},
      {"aten.new_ones", "vector", ""},
      {"aten.new_full", "vector", ""},
      {"aten.empty_like", "vector", "filled with zeros"},
      {"aten.empty", "vector", "filled with zeros"},
      {"aten.arange", "gpsimd", ""},
      {"aten.arange.start", "gpsimd", ""},
      {"aten.arange.start_step", "gpsimd", ""},
  };
  return ops;
}

bool IsNativeOp(const std::string& name) {
  static const std::set<std::string> names = [] {
    std::set<std::string> out;
    for (const auto& op : NativeOps()) out.insert(op.name);
    return out;
  }();
  return names.count(name) > 0;
}

}  // namespace neuron::compiler
