#include "neuron/compiler/device_dtypes.h"

#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {

namespace {

namespace rp = runtime::proto;

struct DeviceDtype {
  const char* ir;
  rp::ElementType device;  // ELEMENT_TYPE_UNSPECIFIED: not on the device
};
constexpr DeviceDtype kDtypes[] = {
#define NEURON_DEVICE_DTYPE(Id, bytes, floating, name, ir, Torch, Device) {ir, rp::Device},
    NEURON_FORALL_DTYPES(NEURON_DEVICE_DTYPE)
#undef NEURON_DEVICE_DTYPE
};

}  // namespace

rp::ElementType DeviceElementType(const std::string& dtype, const std::string& where) {
  const DeviceDtype* found = nullptr;
  for (const auto& d : kDtypes) {
    if (dtype == d.ir && d.device != rp::ELEMENT_TYPE_UNSPECIFIED) found = &d;
  }
  NEURON_CHECK(found != nullptr, where, ": dtype ", dtype,
               " is not supported on the device (float32, bfloat16, float16 and integers are)");
  return found->device;
}

const char* IrDtypeName(rp::ElementType type) {
  for (const auto& d : kDtypes) {
    if (d.device == type && type != rp::ELEMENT_TYPE_UNSPECIFIED) return d.ir;
  }
  NEURON_ASSERT(false, "element type ", static_cast<int>(type), " has no IR dtype");
  return "";
}

}  // namespace neuron::compiler
