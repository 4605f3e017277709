#include "neuron/collectives/dtype.h"

#include <cstdlib>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::collectives {

void UnknownDataType(DataType type) {
  NEURON_ASSERT(false, "unknown DataType ", static_cast<int>(type));
  std::abort();  // not reached: the assertion throws
}

const char* Name(DataType type) {
  switch (type) {
#define NEURON_DATA_TYPE_NAME(Id, bytes, floating, name, ir, Torch, Device) \
  case DataType::k##Id:                                                   \
    return name;
    NEURON_FORALL_DTYPES(NEURON_DATA_TYPE_NAME)
#undef NEURON_DATA_TYPE_NAME
  }
  return "unknown dtype";
}

const char* DataTypeNames() {
  static const std::string names = [] {
    std::string all;
#define NEURON_APPEND_NAME(Id, bytes, floating, name, ir, Torch, Device) \
  all.append(all.empty() ? "" : ", ").append(name);
    NEURON_FORALL_DTYPES(NEURON_APPEND_NAME)
#undef NEURON_APPEND_NAME
    return all;
  }();
  return names.c_str();
}

const char* Name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "unknown reduce op";
}

}  // namespace neuron::collectives
