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

// Throws (an internal error) on a value outside the enum.
[[noreturn]] void UnknownDataType(DataType type);

// Inline: every collective asks, several times.
inline std::size_t ElementSize(DataType type) {
  switch (type) {
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool:
      return 1;
  }
  UnknownDataType(type);
}

inline bool IsFloatingPoint(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat64 ||
         type == DataType::kFloat16 || type == DataType::kBFloat16;
}

const char* Name(DataType type);
const char* Name(ReduceOp op);

}  // namespace neuron::collectives
