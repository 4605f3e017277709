#include "neuron/aten/op_info.h"

#include <algorithm>
#include <mutex>
#include <array>
#include <set>
#include <unordered_map>

#include <c10/util/SmallVector.h>

#include "neuron/runtime/device/op_support.h"

namespace neuron::aten {
namespace {

using runtime::EagerKind;

// Matmul families: how to find [B,] M, K, N in their operands.
enum class MatmulForm { kNone, kMm, kBmm, kMv, kDot, kConv, kAttention };

MatmulForm FormOf(const std::string& base) {
  static const std::unordered_map<std::string, MatmulForm> forms = {
      {"mm", MatmulForm::kMm},
      {"addmm", MatmulForm::kMm},
      {"_addmm_activation", MatmulForm::kMm},
      {"bmm", MatmulForm::kBmm},
      {"baddbmm", MatmulForm::kBmm},
      {"addbmm", MatmulForm::kBmm},
      {"mv", MatmulForm::kMv},
      {"addmv", MatmulForm::kMv},
      {"dot", MatmulForm::kDot},
      {"vdot", MatmulForm::kDot},
      {"convolution", MatmulForm::kConv},
      {"convolution_overrideable", MatmulForm::kConv},
      {"convolution_backward", MatmulForm::kConv},
      {"convolution_backward_overrideable", MatmulForm::kConv},
      {"_scaled_dot_product_flash_attention_for_cpu", MatmulForm::kAttention},
      {"_scaled_dot_product_flash_attention_for_cpu_backward", MatmulForm::kAttention},
  };
  auto it = forms.find(base);
  return it == forms.end() ? MatmulForm::kNone : it->second;
}

std::string BaseName(const c10::OperatorName& name) {
  std::string base = name.name;
  const auto colons = base.find("::");
  if (colons != std::string::npos) base = base.substr(colons + 2);
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') base.pop_back();
  return base;
}

bool IsOptionalGenerator(const c10::TypePtr& type) {
  const auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

OpInfo Build(const c10::OperatorHandle& op) {
  OpInfo info;
  const auto& schema = op.schema();
  info.name = c10::toString(schema.operator_name());
  info.base = BaseName(schema.operator_name());
  const runtime::OpSupport& row = runtime::SupportOf(info.base);
  info.support = row.support;
  info.kind = row.kind;
  info.reason = row.note;
  info.cpu_kernel = op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  info.cpu_arguments_ok = info.base == "index" || info.base == "index_put" ||
                          info.base == "_index_put_impl" || info.base == "_copy_from" ||
                          info.base == "_copy_from_and_resize";
  const bool fused_optimizer = info.base == "_fused_adam" || info.base == "_fused_adamw" ||
                               info.base == "_fused_sgd" || info.base == "_fused_adagrad";
  for (const auto& arg : schema.arguments()) {
    info.generator.push_back(IsOptionalGenerator(arg.type()));
    info.cpu_scalar.push_back(fused_optimizer && arg.name() == "lr");
    info.written.push_back(arg.alias_info() != nullptr && arg.alias_info()->isWrite());
    info.writes |= info.written.back();
  }
  static const std::set<std::string> scans = {"cumsum", "cumprod", "logcumsumexp",
                                              "cummax", "cummin"};
  if (scans.count(info.base)) {
    const auto dim = schema.argumentIndexWithName("dim");
    if (dim) info.scan_dim_argument = static_cast<int>(*dim);
  }
  info.schema = &schema;
  return info;
}

std::int64_t Dim(const at::Tensor& t, std::int64_t d) {
  return t.dim() > d ? t.size(d) : 1;
}

// The matmul operands: the last two inputs of at least one dimension (the
// first input of addmm and friends is the bias).
void DescribeMatmul(MatmulForm form, bool backward, c10::ArrayRef<at::Tensor> in,
                    c10::ArrayRef<at::Tensor> out, runtime::EagerOp& op) {
  c10::SmallVector<const at::Tensor*, 4> operands;
  for (const auto& t : in) {
    if (t.defined() && t.dim() >= 1) operands.push_back(&t);
  }
  if (operands.size() < 2) {
    op.kind = EagerKind::kVector;
    return;
  }
  const at::Tensor& a = *operands[operands.size() - 2];
  const at::Tensor& b = *operands.back();
  op.fp32 = a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble;
  auto& mm = op.matmul;
  switch (form) {
    case MatmulForm::kMm:
      mm = {1, Dim(a, 0), Dim(a, 1), Dim(b, 1)};
      break;
    case MatmulForm::kBmm:
      mm = {Dim(a, 0), Dim(a, 1), Dim(a, 2), Dim(b, 2)};
      break;
    case MatmulForm::kMv:
      mm = {1, Dim(a, 0), Dim(a, 1), 1};
      break;
    case MatmulForm::kDot:
      mm = {1, 1, a.numel(), 1};
      break;
    case MatmulForm::kConv: {
      // Forward: input, weight; backward: grad_output, input, weight. The
      // weight is [C_out, C_in/groups, kernel...]; the output has C_out
      // channels at every output position.
      const at::Tensor& weight = backward ? in[2] : in[1];
      const std::int64_t c_out = std::max<std::int64_t>(Dim(weight, 0), 1);
      const at::Tensor& result = backward ? in[0] : (out.empty() ? in[0] : out[0]);
      mm = {backward ? 2 : 1, result.numel() / std::max<std::int64_t>(Dim(result, 1), 1),
            weight.numel() / c_out, c_out};
      break;
    }
    case MatmulForm::kAttention: {
      // query [B, H, L, E], key [B, H, S, E]: Q x K^T and P x V (backward:
      // grad_out, query, key, ...; four products).
      if (in.size() < 3) return;
      const at::Tensor& q = backward ? in[1] : in[0];
      const at::Tensor& k = backward ? in[2] : in[1];
      mm = {Dim(q, 0) * Dim(q, 1) * (backward ? 4 : 2), Dim(q, 2), Dim(q, 3), Dim(k, 2)};
      break;
    }
    case MatmulForm::kNone:
      break;
  }
}

}  // namespace

runtime::TypeSupport TypeSupportOf(at::ScalarType type) {
  static const auto table = [] {
    std::array<runtime::TypeSupport, static_cast<std::size_t>(at::ScalarType::NumOptions)> out{};
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = runtime::SupportOfType(c10::toString(static_cast<at::ScalarType>(i)));
    }
    return out;
  }();
  const auto index = static_cast<std::size_t>(type);
  return index < table.size() ? table[index] : runtime::TypeSupport::kNative;
}

void CheckType(const OpInfo& info, const at::Tensor& t) {
  if (info.support == runtime::Support::kHostOnly ||
      TypeSupportOf(t.scalar_type()) != runtime::TypeSupport::kUnsupported) {
    return;
  }
  const char* type = c10::toString(t.scalar_type());
  TORCH_CHECK(false, info.name, " on a ", type, " tensor of the neuron device: ",
              runtime::TypeUnsupportedReason(type),
              ". Run it on the CPU (.cpu(), and .to(\"neuron\") after), or ",
              t.is_complex() ? "carry the real and imaginary parts as real tensors."
                             : "convert it to a supported type (.to(torch.float16)).");
}

const OpInfo& InfoOf(const c10::OperatorHandle& op) {
  // The schema object lives as long as the operator: its address is the key.
  thread_local std::unordered_map<const void*, const OpInfo*> local;
  const void* key = &op.schema();
  auto hit = local.find(key);
  if (hit != local.end()) return *hit->second;
  static std::mutex mutex;
  static auto* all = new std::unordered_map<const void*, std::unique_ptr<OpInfo>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*all)[key];
  if (!slot) slot = std::make_unique<OpInfo>(Build(op));
  local.emplace(key, slot.get());
  return *slot;
}

runtime::EagerOp Describe(const OpInfo& info, c10::ArrayRef<at::Tensor> inputs,
                          c10::ArrayRef<at::Tensor> outputs) {
  runtime::EagerOp op;
  op.kind = info.kind;
  std::int64_t in_elements = 0, out_elements = 0;
  int operands = 0;
  bool lacking_type = false;  // a type the core lacks (float64): a CPU fallback
  for (const auto& t : inputs) {
    if (!t.defined()) continue;
    // A 0-dimensional input is a number (Python's 2.0 is a double one): it
    // does not make the op a float64 one, as it does not make its result.
    lacking_type |= t.dim() > 0 &&
                    TypeSupportOf(t.scalar_type()) == runtime::TypeSupport::kCpuFallback;
    in_elements = std::max<std::int64_t>(in_elements, t.numel());
    op.bytes_in += t.numel() * t.element_size();
    ++operands;
  }
  for (const auto& t : outputs) {
    if (!t.defined()) continue;
    CheckType(info, t);
    lacking_type |= TypeSupportOf(t.scalar_type()) == runtime::TypeSupport::kCpuFallback;
    out_elements += t.numel();
    op.bytes_out += t.numel() * t.element_size();
  }
  op.elements = std::max(in_elements, out_elements);
  op.inputs = std::clamp(operands, 1, 3);
  if (lacking_type && info.support == runtime::Support::kNative) {
    op.kind = EagerKind::kFallback;
    return op;
  }
  if (op.kind == EagerKind::kMatmul) {
    DescribeMatmul(FormOf(info.base), info.base.find("backward") != std::string::npos, inputs,
                   outputs, op);
  }
  return op;
}

void DescribeScan(const at::Tensor& input, std::int64_t dim, runtime::EagerOp& op) {
  if (!input.defined()) return;
  const std::int64_t rank = std::max<std::int64_t>(input.dim(), 1);
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) return;  // ATen refused it already
  const std::int64_t length = input.dim() == 0 ? 1 : input.size(d);
  if (length == 0) return;
  op.scan_length = length;
  op.scan_lines = input.numel() / length;
}

}  // namespace neuron::aten
