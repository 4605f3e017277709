#include "neuron/runtime/device/op_support.h"

#include <iterator>
#include <string>
#include <unordered_map>

namespace neuron::runtime {
namespace {

constexpr Support kN = Support::kNative;
constexpr Support kF = Support::kCpuFallback;
constexpr Support kU = Support::kUnsupported;
constexpr Support kH = Support::kHostOnly;

constexpr const char* kTensorEngine = "tensor engine";
constexpr const char* kScalarEngine = "scalar engine";
constexpr const char* kVectorEngine = "vector engine";
constexpr const char* kShape =
    "output shape depends on the values: the host reads the data to size the result";
constexpr const char* kSort = "a sort or selection: no engine instruction sorts";
constexpr const char* kQuantized =
    "quantized tensors are not supported on Neuron (TorchNeuron's compatibility table: N)";
constexpr const char* kComplex =
    "Complex data types are not supported on the Neuron device (NCC_EVRF004)";
constexpr const char* kFnuz =
    "The compiler found usage of F8E4M3FNUZ, F8E4M3B11FNUZ, or F8E5M2FNUZ data type which is "
    "not supported (NCC_EVRF005)";
constexpr const char* kMeta = "sizes, strides and storage only, no device work";

#define NATIVE(name, kind, engine) {name, kN, EagerKind::kind, engine}
#define MATMUL(name) NATIVE(name, kMatmul, kTensorEngine)
#define SCALAR(name) NATIVE(name, kScalar, kScalarEngine)
#define VECTOR(name) NATIVE(name, kVector, kVectorEngine)
#define FALLBACK(name, why) {name, kF, EagerKind::kFallback, why}
#define UNSUPPORTED(name, why) {name, kU, EagerKind::kFallback, why}
#define HOST(name) {name, kH, EagerKind::kView, kMeta}

const OpSupport kTable[] = {
    // Matmuls (and what is one): the tensor engine.
    MATMUL("mm"), MATMUL("addmm"), MATMUL("_addmm_activation"), MATMUL("bmm"),
    MATMUL("baddbmm"), MATMUL("addbmm"), MATMUL("mv"), MATMUL("addmv"), MATMUL("dot"),
    MATMUL("vdot"), MATMUL("convolution"), MATMUL("convolution_overrideable"),
    MATMUL("convolution_backward"), MATMUL("convolution_backward_overrideable"),
    MATMUL("_scaled_dot_product_flash_attention_for_cpu"),
    MATMUL("_scaled_dot_product_flash_attention_for_cpu_backward"),
    MATMUL("_scaled_dot_product_efficient_attention"),
    MATMUL("_scaled_dot_product_efficient_attention_backward"),
    // Transcendentals and what is built on them: the scalar engine.
    SCALAR("exp"), SCALAR("exp2"), SCALAR("expm1"), SCALAR("log"), SCALAR("log2"),
    SCALAR("log10"), SCALAR("log1p"), SCALAR("tanh"), SCALAR("sigmoid"), SCALAR("gelu"),
    SCALAR("silu"), SCALAR("mish"), SCALAR("erf"), SCALAR("erfc"), SCALAR("erfinv"),
    SCALAR("sqrt"), SCALAR("rsqrt"), SCALAR("pow"), SCALAR("sin"), SCALAR("cos"),
    SCALAR("tan"), SCALAR("atan"), SCALAR("atan2"), SCALAR("asin"), SCALAR("acos"),
    SCALAR("sinh"), SCALAR("cosh"), SCALAR("asinh"), SCALAR("acosh"), SCALAR("atanh"),
    SCALAR("logit"), SCALAR("softplus"), SCALAR("softplus_backward"), SCALAR("elu"),
    SCALAR("elu_backward"), SCALAR("selu"), SCALAR("celu"), SCALAR("reciprocal"),
    SCALAR("logsumexp"), SCALAR("_softmax"), SCALAR("_log_softmax"),
    SCALAR("_softmax_backward_data"), SCALAR("_log_softmax_backward_data"),
    SCALAR("tanh_backward"), SCALAR("sigmoid_backward"), SCALAR("gelu_backward"),
    SCALAR("silu_backward"), SCALAR("mish_backward"), SCALAR("log_sigmoid_forward"),
    SCALAR("log_sigmoid_backward"), SCALAR("_foreach_sqrt"), SCALAR("_foreach_pow"),
    SCALAR("_foreach_exp"),
    // Arithmetic, comparisons, reductions, normalisation, losses, indexing,
    // data movement, random numbers, optimizer updates: the vector engine.
    VECTOR("add"), VECTOR("sub"), VECTOR("rsub"), VECTOR("mul"), VECTOR("div"),
    VECTOR("neg"), VECTOR("abs"), VECTOR("square"), VECTOR("relu"), VECTOR("leaky_relu"),
    VECTOR("leaky_relu_backward"), VECTOR("hardtanh"), VECTOR("hardtanh_backward"),
    VECTOR("hardsigmoid"), VECTOR("hardsigmoid_backward"), VECTOR("hardswish"),
    VECTOR("hardswish_backward"), VECTOR("threshold"), VECTOR("threshold_backward"),
    VECTOR("where"), VECTOR("masked_fill"), VECTOR("eq"), VECTOR("ne"), VECTOR("lt"),
    VECTOR("le"), VECTOR("gt"), VECTOR("ge"), VECTOR("maximum"), VECTOR("minimum"),
    VECTOR("clamp"), VECTOR("clamp_min"), VECTOR("clamp_max"), VECTOR("sum"),
    VECTOR("mean"), VECTOR("native_layer_norm"), VECTOR("native_layer_norm_backward"),
    VECTOR("native_group_norm"), VECTOR("native_group_norm_backward"),
    VECTOR("native_batch_norm"), VECTOR("native_batch_norm_backward"),
    VECTOR("_native_batch_norm_legit"), VECTOR("_native_batch_norm_legit_no_training"),
    VECTOR("_fused_rms_norm"), VECTOR("nll_loss_forward"), VECTOR("nll_loss_backward"),
    VECTOR("nll_loss2d_forward"), VECTOR("nll_loss2d_backward"), VECTOR("fill"),
    VECTOR("zero"), VECTOR("addcmul"), VECTOR("addcdiv"), VECTOR("lerp"), VECTOR("max"),
    VECTOR("min"), VECTOR("amax"), VECTOR("amin"), VECTOR("aminmax"), VECTOR("argmax"),
    VECTOR("argmin"), VECTOR("cat"), VECTOR("stack"), VECTOR("_stack"),
    VECTOR("index_select"), VECTOR("gather"), VECTOR("scatter"), VECTOR("scatter_add"),
    VECTOR("scatter_reduce"), VECTOR("index"), VECTOR("index_put"),
    VECTOR("_index_put_impl"), VECTOR("index_add"), VECTOR("index_copy"),
    VECTOR("index_fill"), VECTOR("embedding"), VECTOR("embedding_dense_backward"),
    VECTOR("clone"), VECTOR("copy"), VECTOR("_to_copy"), VECTOR("sign"), VECTOR("sgn"),
    VECTOR("bernoulli"), VECTOR("uniform"), VECTOR("normal"), VECTOR("random"),
    VECTOR("native_dropout"), VECTOR("native_dropout_backward"), VECTOR("masked_scatter"),
    VECTOR("cumsum"), VECTOR("cumprod"), VECTOR("logcumsumexp"), VECTOR("cummax"),
    VECTOR("cummin"), VECTOR("topk"), VECTOR("_foreach_add"), VECTOR("_foreach_mul"),
    VECTOR("_foreach_div"), VECTOR("_foreach_sub"), VECTOR("_foreach_addcmul"),
    VECTOR("_foreach_addcdiv"), VECTOR("_foreach_lerp"), VECTOR("_foreach_norm"),
    VECTOR("_foreach_neg"), VECTOR("_foreach_zero"), VECTOR("_foreach_copy"),
    VECTOR("_foreach_maximum"), VECTOR("_foreach_clamp_min"), VECTOR("_foreach_clamp_max"),
    VECTOR("linalg_vector_norm"), VECTOR("norm"), VECTOR("mse_loss"),
    VECTOR("mse_loss_backward"), VECTOR("smooth_l1_loss"), VECTOR("smooth_l1_loss_backward"),
    VECTOR("binary_cross_entropy"), VECTOR("binary_cross_entropy_backward"),
    VECTOR("_fused_adam"), VECTOR("_fused_adamw"), VECTOR("_fused_sgd"),
    VECTOR("_fused_adagrad"), VECTOR("ones_like"), VECTOR("zeros_like"), VECTOR("full_like"),
    VECTOR("arange"), VECTOR("linspace"), VECTOR("isnan"), VECTOR("isinf"),
    VECTOR("isfinite"), VECTOR("nan_to_num"), VECTOR("logical_not"), VECTOR("logical_and"),
    VECTOR("logical_or"), VECTOR("logical_xor"), VECTOR("bitwise_and"), VECTOR("bitwise_or"),
    VECTOR("bitwise_xor"), VECTOR("bitwise_not"), VECTOR("floor"), VECTOR("ceil"),
    VECTOR("round"), VECTOR("trunc"), VECTOR("frac"), VECTOR("remainder"), VECTOR("fmod"),
    VECTOR("floor_divide"), VECTOR("var"), VECTOR("std"), VECTOR("var_mean"),
    VECTOR("std_mean"), VECTOR("prod"), VECTOR("all"), VECTOR("any"), VECTOR("tril"),
    VECTOR("triu"), VECTOR("repeat"), VECTOR("flip"), VECTOR("roll"),
    VECTOR("constant_pad_nd"), VECTOR("max_pool2d_with_indices"),
    VECTOR("max_pool2d_with_indices_backward"), VECTOR("avg_pool2d"),
    VECTOR("avg_pool2d_backward"), VECTOR("_adaptive_avg_pool2d"),
    VECTOR("_adaptive_avg_pool2d_backward"), VECTOR("upsample_nearest2d"),
    VECTOR("upsample_nearest2d_backward"), VECTOR("slice_backward"),
    VECTOR("select_backward"), VECTOR("zeros"), VECTOR("ones"), VECTOR("full"),
    VECTOR("new_zeros"), VECTOR("new_ones"), VECTOR("new_full"),
    // A scalar read back to the host: one transfer.
    NATIVE("_local_scalar_dense", kCopy, "DMA to the host"),
    NATIVE("_copy_from", kCopy, "DMA between host and device, or within HBM"),
    NATIVE("_copy_from_and_resize", kCopy, "DMA between host and device, or within HBM"),
    // CPU fallbacks TorchNeuron's way: the CPU's kernel, with the copies.
    FALLBACK("nonzero", kShape), FALLBACK("_unique", kShape), FALLBACK("_unique2", kShape),
    FALLBACK("unique_dim", kShape), FALLBACK("unique_consecutive", kShape),
    FALLBACK("unique_dim_consecutive", kShape), FALLBACK("masked_select", kShape),
    FALLBACK("repeat_interleave", kShape), FALLBACK("bincount", kShape),
    FALLBACK("histc", kShape), FALLBACK("sort", kSort), FALLBACK("argsort", kSort),
    FALLBACK("msort", kSort), FALLBACK("kthvalue", kSort), FALLBACK("median", kSort),
    FALLBACK("nanmedian", kSort), FALLBACK("mode", kSort),
    // Refused, as Neuron refuses them.
    UNSUPPORTED("quantize_per_tensor", kQuantized),
    UNSUPPORTED("quantize_per_tensor_dynamic", kQuantized),
    UNSUPPORTED("quantize_per_channel", kQuantized), UNSUPPORTED("dequantize", kQuantized),
    UNSUPPORTED("_make_per_tensor_quantized_tensor", kQuantized),
    UNSUPPORTED("_make_per_channel_quantized_tensor", kQuantized),
    UNSUPPORTED("_fft_r2c", kComplex), UNSUPPORTED("_fft_c2r", kComplex),
    UNSUPPORTED("_fft_c2c", kComplex), UNSUPPORTED("complex", kComplex),
    UNSUPPORTED("polar", kComplex),
    // Metadata: no device work.
    HOST("empty"), HOST("empty_strided"), HOST("empty_like"), HOST("new_empty"), HOST("reshape"), HOST("as_strided"), HOST("view"),
    HOST("_unsafe_view"), HOST("_reshape_alias"), HOST("expand"), HOST("permute"),
    HOST("t"), HOST("transpose"), HOST("squeeze"), HOST("unsqueeze"), HOST("select"),
    HOST("slice"), HOST("narrow"), HOST("split"), HOST("split_with_sizes"),
    HOST("unbind"), HOST("chunk"), HOST("unfold"), HOST("diagonal"), HOST("detach"),
    HOST("alias"), HOST("view_as_real"), HOST("view_as_complex"), HOST("_conj"),
    HOST("_neg_view"), HOST("resize"), HOST("set"), HOST("lift_fresh"),
    HOST("_has_compatible_shallow_copy_type"), HOST("record_stream"), HOST("is_same_size"), HOST("result_type"),
};

#undef NATIVE
#undef MATMUL
#undef SCALAR
#undef VECTOR
#undef FALLBACK
#undef UNSUPPORTED
#undef HOST

const OpSupport kUnlisted = {"", kF, EagerKind::kFallback,
                             "no Neuron kernel: the CPU's kernel runs it"};

}  // namespace

const char* Name(Support support) {
  switch (support) {
    case Support::kNative:
      return "native";
    case Support::kCpuFallback:
      return "CPU fallback";
    case Support::kUnsupported:
      return "unsupported";
    case Support::kHostOnly:
      return "host-only";
  }
  return "?";
}

const std::vector<OpSupport>& OpSupportTable() {
  static const std::vector<OpSupport> table(std::begin(kTable), std::end(kTable));
  return table;
}

const OpSupport& SupportOf(std::string_view base) {
  static const auto* by_name = [] {
    auto* out = new std::unordered_map<std::string_view, const OpSupport*>();
    for (const OpSupport& row : OpSupportTable()) out->emplace(row.op, &row);
    return out;
  }();
  auto it = by_name->find(base);
  return it == by_name->end() ? kUnlisted : *it->second;
}

namespace {

bool IsFnuz(std::string_view name) {
  return name.size() > 4 && name.substr(0, 6) == "Float8" && name.substr(name.size() - 4) == "fnuz";
}

}  // namespace

TypeSupport SupportOfType(std::string_view name) {
  if (name == "Double") return TypeSupport::kCpuFallback;
  if (name.substr(0, 7) == "Complex" || IsFnuz(name)) return TypeSupport::kUnsupported;
  return TypeSupport::kNative;
}

const char* TypeUnsupportedReason(std::string_view name) {
  return name.substr(0, 7) == "Complex" ? kComplex : IsFnuz(name) ? kFnuz : "";
}

}  // namespace neuron::runtime
