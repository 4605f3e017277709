// scaled_dot_product_attention on "neuron": the CPU's kernel choice, with
// its fused (flash) kernel reached through the efficient-attention ops.
//
// F.scaled_dot_product_attention asks _fused_sdp_choice_stub which kernel
// to run on the tensors' device. Where the CPU would run its flash kernel
// (_scaled_dot_product_flash_attention_for_cpu), "neuron" answers
// efficient attention: aten::_scaled_dot_product_efficient_attention and
// its backward, which DTensor has sharding strategies for (batch and head
// sharding, tensor parallel attention) and the CPU's op has none. Their
// "neuron" kernels run the CPU's flash kernel and its backward, so the
// numbers are the CPU's to the bit. Where the CPU would decompose (dropout,
// shapes its flash kernel refuses), "neuron" decomposes too: math attention
// is made of ops DTensor shards one by one.
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace neuron::aten {
namespace {

using at::SDPBackend;

int64_t FusedSdpChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                       bool is_causal, std::optional<double> scale, bool enable_gqa) {
  const int64_t cpu = at::_ops::_fused_sdp_choice::redispatch(
      c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value, attn_mask, dropout_p,
      is_causal, scale, enable_gqa);
  // Efficient attention has no grouped-query form: keep the CPU's choice.
  const bool same_heads = query.dim() == 4 && key.dim() == 4 && value.dim() == 4 &&
                          key.size(1) == query.size(1) && value.size(1) == query.size(1);
  if (cpu == static_cast<int64_t>(SDPBackend::flash_attention) && same_heads && dropout_p == 0) {
    return static_cast<int64_t>(SDPBackend::efficient_attention);
  }
  return cpu;
}

// query (B, H, L, E), key (B, H, S, E), value (B, H, S, Ev), attn_bias
// broadcastable to (B, H, L, S) -> output (B, H, L, Ev), logsumexp
// (B, H, L) float, and the (unused) dropout seed and offset.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> EfficientAttention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias, bool /*compute_log_sumexp*/, double dropout_p,
    bool is_causal, std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0,
              "neuron: _scaled_dot_product_efficient_attention runs the CPU's flash kernel, "
              "which has no dropout; scaled_dot_product_attention with dropout_p > 0 takes "
              "math attention");
  auto [out, logsumexp] = at::_scaled_dot_product_flash_attention_for_cpu(
      query, key, value, dropout_p, is_causal, attn_bias, scale);
  const auto seed_options = query.options().dtype(at::kLong);
  return {out, logsumexp, at::empty({}, seed_options), at::empty({}, seed_options)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> EfficientAttentionBackward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, double dropout_p, std::array<bool, 4> grad_input_mask,
    bool is_causal, std::optional<double> scale) {
  TORCH_CHECK(!(grad_input_mask[3] && attn_bias.defined()),
              "neuron: scaled_dot_product_attention has no gradient for attn_mask (the CPU's "
              "flash kernel computes none); detach the mask");
  std::optional<at::Tensor> mask;
  if (attn_bias.defined()) mask = attn_bias;
  auto [grad_query, grad_key, grad_value] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, mask, scale);
  return {grad_query, grad_key, grad_value, at::Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_efficient_attention", TORCH_FN(EfficientAttention));
  m.impl("_scaled_dot_product_efficient_attention_backward",
         TORCH_FN(EfficientAttentionBackward));
}

}  // namespace neuron::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron::aten::FusedSdpChoice)
}  // namespace at::native
