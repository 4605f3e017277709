// Element types and reduce operations the collectives move and reduce.
//
// Usage:
//   std::size_t bytes = count * ElementSize(DataType::kBFloat16);
//   std::string what = StrCat(Name(DataType::kInt8), " ", Name(ReduceOp::kBxor));
#pragma once

#include <cstddef>
#include <cstdint>

namespace neuron::collectives {

enum class DataType : std::uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,  // one byte, 0 or 1
};

enum class ReduceOp : std::uint8_t {
  kSum,
  kProduct,
  kMin,
  kMax,
  kAvg,   // sum, then divided by the number of contributions
  kBand,  // integers and bool only
  kBor,
  kBxor,
};

std::size_t ElementSize(DataType type);
const char* Name(DataType type);
const char* Name(ReduceOp op);
bool IsFloatingPoint(DataType type);

}  // namespace neuron::collectives
