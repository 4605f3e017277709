// The executor's sgemm inside PyTorch: the BLAS eager PyTorch's matmuls
// run (MKL in its x86 wheels), so a compiled graph's products run as fast
// as eager's on the same CPU. "aten": each product (of a batch, one after
// another) calls that BLAS's sgemm_ directly (the symbol libtorch_cpu
// exports, found beside ATen's own mm), as ATen's mm does after its
// dispatch. "aten-dispatch", where libtorch_cpu exports no sgemm_: ATen's
// mm / bmm over the plan's memory (from_blob views, no copies). Registered
// and installed when the device library loads.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <dlfcn.h>

#include "neuron/runtime/device/sgemm.h"

namespace neuron::aten {
namespace {

// Fortran BLAS: column-major, arguments by address, 32-bit integers (the
// LP64 interface; sgemm_64_ is the ILP64 one).
using FortranSgemm = void (*)(const char* transa, const char* transb, const int* m,
                              const int* n, const int* k, const float* alpha,
                              const float* a, const int* lda, const float* b,
                              const int* ldb, const float* beta, float* c,
                              const int* ldc);

// The sgemm_ of the library that holds ATen's mm, or null.
FortranSgemm TorchSgemm() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&at::_ops::mm::call), &info) == 0 ||
      info.dli_fname == nullptr) {
    return nullptr;
  }
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  // Searches that library and what it loaded, not the process's first
  // sgemm_ (this library's own OpenBLAS exports one too).
  return reinterpret_cast<FortranSgemm>(dlsym(library, "sgemm_"));
}

// c[m,n] (+)= a[m,k] x b[k,n], row-major: in column-major terms
// c^T = b^T x a^T, so b is BLAS's first operand.
void DirectSgemm(FortranSgemm sgemm, const float* a, const float* b, float* c,
                 std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate,
                 bool transpose_a, bool transpose_b) {
  const int mi = static_cast<int>(m), ki = static_cast<int>(k), ni = static_cast<int>(n);
  const char op_b = transpose_b ? 'T' : 'N', op_a = transpose_a ? 'T' : 'N';
  const int ldb = transpose_b ? ki : ni, lda = transpose_a ? mi : ki;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // beta 0: c is not read
  sgemm(&op_b, &op_a, &ni, &mi, &ki, &alpha, b, &ldb, a, &lda, &beta, c, &ni);
}

const FortranSgemm kDirect = TorchSgemm();

// The executor checks m, k and n against 2^31 - 1 (RunMatmul).
void DirectBatch(const float* a, const float* b, float* c, std::int64_t batch,
                 std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate,
                 bool transpose_a, bool transpose_b) {
  for (std::int64_t p = 0; p < batch; ++p) {
    DirectSgemm(kDirect, a + p * m * k, b + p * k * n, c + p * m * n, m, k, n, accumulate,
                transpose_a, transpose_b);
  }
}

void DispatchedSgemm(const float* a, const float* b, float* c, std::int64_t batch,
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

constexpr runtime::Sgemm kAten{"aten", &DirectBatch};
constexpr runtime::Sgemm kAtenDispatch{"aten-dispatch", &DispatchedSgemm};
// Both registered (torchneuron._C._set_executor_sgemm picks one), the
// direct one installed where it exists.
bool Install() {
  runtime::RegisterSgemm(&kAtenDispatch);
  if (kDirect != nullptr) runtime::RegisterSgemm(&kAten);
  runtime::SetSgemm(kDirect != nullptr ? &kAten : &kAtenDispatch);
  return true;
}
const bool kInstalled = Install();

}  // namespace
}  // namespace neuron::aten
