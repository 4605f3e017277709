// Test helper: doubles stored as elements of any collectives dtype (values
// are cast as the dtype's C++ type would; bool is value != 0).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "neuron/collectives/dtype.h"
#include "neuron/collectives/half.h"
#include "neuron/collectives/reduce.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives::testing {

inline std::vector<unsigned char> Encode(DataType type, const std::vector<double>& values) {
  std::vector<unsigned char> out(values.size() * ElementSize(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    unsigned char* p = out.data() + i * ElementSize(type);
    const double v = values[i];
    auto put = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
    switch (type) {
      case DataType::kFloat32: put(static_cast<float>(v)); break;
      case DataType::kFloat64: put(v); break;
      case DataType::kFloat16: put(FloatToHalf(static_cast<float>(v))); break;
      case DataType::kBFloat16: put(FloatToBFloat16(static_cast<float>(v))); break;
      case DataType::kInt8: put(static_cast<std::int8_t>(v)); break;
      case DataType::kUInt8: put(static_cast<std::uint8_t>(v)); break;
      case DataType::kInt32: put(static_cast<std::int32_t>(v)); break;
      case DataType::kInt64: put(static_cast<std::int64_t>(v)); break;
      case DataType::kBool: put(static_cast<std::uint8_t>(v != 0)); break;
    }
  }
  return out;
}

// Whether the kernels define `op` for `type` (CheckReducible does not throw).
inline bool Supported(DataType type, ReduceOp op) {
  try {
    CheckReducible(type, op, "test");
    return true;
  } catch (const InvalidUsage&) {
    return false;
  }
}

}  // namespace neuron::collectives::testing
