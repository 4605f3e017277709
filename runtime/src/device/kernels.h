// The executor's CPU kernels: element conversion to and from float32, the
// matmul, and the elementwise ops (executor.h lists their semantics).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime::kernels {

// Whether the device computes in `type` (float32, bfloat16, float16).
bool IsFloat(proto::ElementType type);
std::vector<float> ToFloat(const std::uint8_t* data, proto::ElementType type,
                           std::size_t n);
void FromFloat(const float* values, std::size_t n, proto::ElementType type,
               std::uint8_t* out);
void FromFloat(const std::vector<float>& values, proto::ElementType type,
               std::uint8_t* out);

// For each of `batch` products: c[m,n] (+)= a[m,k] x b[k,n], row-major
// float32, packed one after another; a stored as [k,m] when transpose_a, b
// as [n,k] when transpose_b (sgemm.h runs it).
void Matmul(const float* a, const float* b, float* c, std::int64_t batch, std::int64_t m,
            std::int64_t k, std::int64_t n, bool accumulate, bool transpose_a = false,
            bool transpose_b = false);

// Apply `op` over the n elements of `out`, reading a[0..n) and (binary ops)
// b[0..nb), which repeats when shorter. `out` may be `a` itself, not
// overlap it otherwise, nor overlap `b`. Return false when `op` is not a
// known op of that arity (or `b` is empty and n is not 0).
bool Unary(proto::Op op, const float* a, std::size_t n, double scalar, float* out);
bool Binary(proto::Op op, const float* a, const float* b, std::size_t nb, double scalar,
            float* out, std::size_t n);
// Ops over [rows, cols] row-major inputs (as many as the op's registry row
// says, device_ops.h), row by row:
//   transpose (a -> [cols, rows]), sum_rows (a -> [cols], the sum over rows
//   in row order), softmax_rows and log_softmax_rows (a -> [rows, cols],
//   over each row, max-subtracted), softmax_backward_rows and
//   log_softmax_backward_rows (grad, forward output -> the input's grad).
// `out` holds what the op writes and overlaps no input.
bool Shaped(proto::Op op, const std::vector<const float*>& in, std::int64_t rows,
            std::int64_t cols, float* out);

// The running sum along the middle dimension of [outer, len, inner]
// row-major (torch.cumsum): out[o, t, i] = the sum of a[o, 0..t, i], added
// in order of t in `Acc` and rounded to float after each add, as ATen's CPU
// kernel does (double for float32 results, float for bfloat16 and
// float16). `out` may be `a` itself.
template <typename Acc>
void Cumsum(const float* a, std::int64_t outer, std::int64_t len, std::int64_t inner,
            float* out);

// Layer norm over each row of [rows, cols] (torch.native_layer_norm):
// forward (x, weight, bias -> y, mean [rows], rstd [rows]) and backward
// (grad, x, mean, rstd, weight -> grad x, grad weight [cols], grad bias
// [cols]). No output overlaps an input.
void LayerNorm(const float* x, const float* w, const float* b, std::int64_t rows,
               std::int64_t cols, double eps, float* y, float* mean, float* rstd);
void LayerNormBackward(const float* g, const float* x, const float* mean,
                       const float* rstd, const float* w, std::int64_t rows,
                       std::int64_t cols, float* gx, float* gw, float* gb);

}  // namespace neuron::runtime::kernels
