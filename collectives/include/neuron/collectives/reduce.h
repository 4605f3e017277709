// Elementwise reduction kernels, the one place the collectives combine data.
//
// Order and precision contract (what makes results bitwise deterministic):
// - ReduceInputs combines inputs[0], inputs[1], ... strictly left to right,
//   whatever order they arrived in. float16 and bfloat16 accumulate in
//   float32 and round once at the end; every other type computes in itself
//   (integers wrap as two's complement).
// - Accumulate combines two buffers (inout = inout op in) for algorithms that
//   reduce pairwise along a ring or tree; half types round after each step.
// - kAvg combines as a sum; ReduceInputs divides by `avg_divisor` before its
//   final rounding, FinishAverage divides a buffer afterwards (integers:
//   truncating division, as in PyTorch).
// - bool: kSum, kMax and kBor are logical or; kProduct, kMin and kBand are
//   logical and; kBxor is exclusive or (as c10d maps bool reductions).
// - kMin/kMax propagate NaN, like torch.minimum/torch.maximum.
//
// Usage:
//   CheckReducible(DataType::kFloat32, ReduceOp::kBand, "allreduce");  // throws
//   const void* in[] = {a, b, c};
//   ReduceInputs(DataType::kBFloat16, ReduceOp::kAvg, in, 3, out, n, 3);
#pragma once

#include <cstddef>

#include "neuron/collectives/dtype.h"

namespace neuron::collectives {

// Throws InvalidUsage naming `op_name`, the dtype and the reduce op when the
// pair is unsupported (bitwise ops on floating point, kAvg on bool).
void CheckReducible(DataType type, ReduceOp op, const char* op_name);

void ReduceInputs(DataType type, ReduceOp op, const void* const* inputs,
                  std::size_t num_inputs, void* out, std::size_t count,
                  std::size_t avg_divisor);

void Accumulate(DataType type, ReduceOp op, void* inout, const void* in,
                std::size_t count);

void FinishAverage(DataType type, void* buffer, std::size_t count, std::size_t divisor);

}  // namespace neuron::collectives
