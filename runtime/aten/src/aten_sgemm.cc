// The executor's sgemm inside PyTorch: ATen's own matmul over the plan's
// memory (from_blob views, no copies), so a compiled graph's matmuls run
// on the BLAS eager PyTorch uses, with its intra-op threads
// (torch.set_num_threads). Installed when the device library loads.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "neuron/runtime/device/sgemm.h"

namespace neuron::aten {
namespace {

void AtenSgemm(const float* a, const float* b, float* c, std::int64_t batch,
               std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate,
               bool transpose_a, bool transpose_b) {
  c10::InferenceMode no_autograd;
  // The plan's own work: a Python dispatch mode (FlopCounterMode, say)
  // active around a compiled graph does not see it as torch ops.
  c10::impl::ExcludeDispatchKeyGuard no_modes(c10::DispatchKeySet(
      {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // [batch, rows, cols], from memory stored [batch, cols, rows] when
  // transposed.
  auto view = [&](const float* p, std::int64_t rows, std::int64_t cols, bool transposed) {
    auto* data = const_cast<float*>(p);  // read only
    return transposed ? at::from_blob(data, {batch, cols, rows}, f32).transpose(1, 2)
                      : at::from_blob(data, {batch, rows, cols}, f32);
  };
  const at::Tensor lhs = view(a, m, k, transpose_a), rhs = view(b, k, n, transpose_b);
  at::Tensor out = at::from_blob(c, {batch, m, n}, f32);
  if (batch == 1) {  // mm: the 2-D path of eager's linear layers
    at::Tensor out2 = out[0];
    if (accumulate) {
      out2.addmm_(lhs[0], rhs[0]);
    } else {
      at::mm_out(out2, lhs[0], rhs[0]);
    }
  } else if (accumulate) {
    out.baddbmm_(lhs, rhs);
  } else {
    at::bmm_out(out, lhs, rhs);
  }
}

constexpr runtime::Sgemm kAten{"aten", &AtenSgemm};
const bool kInstalled = (runtime::SetSgemm(&kAten), true);

}  // namespace
}  // namespace neuron::aten
