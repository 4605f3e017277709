// The float32 matrix multiply under the executor's matmul, chosen per
// process: OpenBLAS's single-threaded sgemm, unless the process installs
// another. The torch-facing device (neuron::aten) installs ATen's, the
// BLAS PyTorch's own matmuls run (MKL in its x86 wheels), so compiled
// graphs multiply as fast as eager PyTorch does on the same CPU.
#pragma once

#include <cstdint>

namespace neuron::runtime {

// c[m,n] = a[m,k] x b[k,n], plus c's old value when `accumulate`; all
// row-major float32, a stored as [k,m] when transpose_a, b as [n,k] when
// transpose_b; m, n, k > 0 and c overlaps neither operand.
struct Sgemm {
  const char* name;  // "openblas", "aten"
  void (*run)(const float* a, const float* b, float* c, std::int64_t m, std::int64_t k,
              std::int64_t n, bool accumulate, bool transpose_a, bool transpose_b);
};

// The process's sgemm; thread-safe. SetSgemm(nullptr) restores OpenBLAS's.
const Sgemm& CurrentSgemm();
void SetSgemm(const Sgemm* sgemm);

}  // namespace neuron::runtime
