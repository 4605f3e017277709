// The float32 matrix multiply under the executor's matmul, chosen per
// process: OpenBLAS's single-threaded sgemm, unless the process installs
// another. The torch-facing device (neuron::aten) installs ATen's, the
// BLAS PyTorch's own matmuls run (MKL in its x86 wheels), so compiled
// graphs multiply as fast as eager PyTorch does on the same CPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace neuron::runtime {

// For each of `batch` products p: c[p][m,n] = a[p][m,k] x b[p][k,n], plus
// c[p]'s old value when `accumulate`; all row-major float32 and packed one
// product after another, a[p] stored as [k,m] when transpose_a, b[p] as
// [n,k] when transpose_b; batch, m, n, k > 0 and c overlaps neither
// operand.
struct Sgemm {
  const char* name;  // "openblas", "aten", "aten-dispatch"
  void (*run)(const float* a, const float* b, float* c, std::int64_t batch,
              std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate,
              bool transpose_a, bool transpose_b);
};

// The process's sgemm; thread-safe. SetSgemm(nullptr) restores OpenBLAS's.
const Sgemm& CurrentSgemm();
void SetSgemm(const Sgemm* sgemm);

// The sgemms this process can run, by name: "openblas" always, and those a
// library registers (neuron::aten: "aten" where libtorch_cpu exports
// sgemm_, and "aten-dispatch"). `sgemm` must outlive the process (a
// static); registering a name again replaces the entry. Thread-safe.
void RegisterSgemm(const Sgemm* sgemm);
// The registered sgemm named `name`, or null.
const Sgemm* FindSgemm(std::string_view name);
// The registered names, in the order they were first registered.
std::vector<std::string> SgemmNames();

}  // namespace neuron::runtime
