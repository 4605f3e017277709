#include "neuron/compiler/torch_tensors.h"

#include <ATen/ATen.h>

#include <cstring>

#include "neuron/runtime/error.h"

namespace neuron::compiler {

namespace rp = runtime::proto;

rp::ElementType ElementTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return rp::F32;
    case at::kBFloat16:
      return rp::BF16;
    case at::kHalf:
      return rp::F16;
    case at::kLong:
      return rp::I64;
    case at::kInt:
      return rp::I32;
    case at::kChar:
      return rp::I8;
    case at::kByte:
      return rp::U8;
    case at::kBool:
      return rp::BOOL;
    default:
      throw InvalidUsage(StrCat("compiled graph: dtype ",
                                                c10::toString(type),
                                                " is not supported on the device"));
  }
}

at::ScalarType ScalarTypeOf(rp::ElementType type) {
  switch (type) {
    case rp::F32:
      return at::kFloat;
    case rp::BF16:
      return at::kBFloat16;
    case rp::F16:
      return at::kHalf;
    case rp::I64:
      return at::kLong;
    case rp::I32:
      return at::kInt;
    case rp::I8:
      return at::kChar;
    case rp::U8:
      return at::kByte;
    default:
      return at::kBool;
  }
}

runtime::HostTensor ToHost(const at::Tensor& t) {
  NEURON_CHECK(t.device().is_cpu() && t.layout() == at::kStrided,
               "compiled graph: inputs must be dense CPU tensors, got one on ",
               t.device().str());
  const at::Tensor c = t.contiguous();
  runtime::HostTensor h;
  h.dtype = ElementTypeOf(c.scalar_type());
  h.shape.assign(c.sizes().begin(), c.sizes().end());
  const auto* bytes = static_cast<const std::uint8_t*>(c.data_ptr());
  h.data.assign(bytes, bytes + c.numel() * c.element_size());
  return h;
}

at::Tensor FromHost(const runtime::HostTensor& h) {
  at::Tensor t = at::empty(h.shape, at::TensorOptions().dtype(ScalarTypeOf(h.dtype)));
  std::memcpy(t.data_ptr(), h.data.data(), h.data.size());
  return t;
}

}  // namespace neuron::compiler
