#include "neuron/compiler/device_dtypes.h"

#include "neuron/runtime/error.h"

namespace neuron::compiler {

namespace {

namespace rp = runtime::proto;

struct DeviceDtype {
  const char* ir;
  rp::ElementType device;
};
constexpr DeviceDtype kDtypes[] = {{"f32", rp::F32}, {"bf16", rp::BF16}, {"f16", rp::F16},
                                   {"i64", rp::I64}, {"i32", rp::I32},   {"i8", rp::I8},
                                   {"u8", rp::U8},   {"bool", rp::BOOL}};

}  // namespace

rp::ElementType DeviceElementType(const std::string& dtype, const std::string& where) {
  const DeviceDtype* found = nullptr;
  for (const auto& d : kDtypes) {
    if (dtype == d.ir) found = &d;
  }
  NEURON_CHECK(found != nullptr, where, ": dtype ", dtype,
               " is not supported on the device (float32, bfloat16, float16 and integers are)");
  return found->device;
}

const char* IrDtypeName(rp::ElementType type) {
  for (const auto& d : kDtypes) {
    if (d.device == type) return d.ir;
  }
  NEURON_ASSERT(false, "element type ", static_cast<int>(type), " has no IR dtype");
  return "";
}

}  // namespace neuron::compiler
