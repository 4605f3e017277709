// Element types and reduce operations the collectives move and reduce.
//
// Usage:
//   std::size_t bytes = count * ElementSize(DataType::kBFloat16);
//   std::string what = StrCat(Name(DataType::kInt8), " ", Name(ReduceOp::kBxor));
#pragma once

#include <cstddef>
#include <cstdint>

#include "neuron/runtime/dtype_list.h"

namespace neuron::collectives {

// runtime/dtype_list.h's types, in its order (the index travels in headers).
enum class DataType : std::uint8_t {
#define NEURON_DATA_TYPE(Id, bytes, floating, name, ir, Torch, Device) k##Id,
  NEURON_FORALL_DTYPES(NEURON_DATA_TYPE)
#undef NEURON_DATA_TYPE
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
#define NEURON_ELEMENT_SIZE(Id, bytes, floating, name, ir, Torch, Device) \
  case DataType::k##Id:                                                 \
    return bytes;
    NEURON_FORALL_DTYPES(NEURON_ELEMENT_SIZE)
#undef NEURON_ELEMENT_SIZE
  }
  UnknownDataType(type);
}

inline bool IsFloatingPoint(DataType type) {
  switch (type) {
#define NEURON_IS_FLOATING(Id, bytes, floating, name, ir, Torch, Device) \
  case DataType::k##Id:                                                \
    return floating;
    NEURON_FORALL_DTYPES(NEURON_IS_FLOATING)
#undef NEURON_IS_FLOATING
  }
  UnknownDataType(type);
}

const char* Name(DataType type);
// Every DataType's name, in order, comma-separated: for messages.
const char* DataTypeNames();
const char* Name(ReduceOp op);

}  // namespace neuron::collectives
