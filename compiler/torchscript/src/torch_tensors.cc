#include "neuron/compiler/torch_tensors.h"

#include <ATen/ATen.h>

#include <cstring>
#include <memory>

#include "neuron/compiler/device_dtypes.h"
#include "neuron/runtime/config.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {

namespace rp = runtime::proto;

namespace {

// The dtypes the device takes: torch's and the runtime's (device_dtypes.h
// names them in the IR); float64's device type is unspecified: not taken.
struct DeviceType {
  at::ScalarType torch;
  rp::ElementType device;
};
constexpr DeviceType kTypes[] = {
#define NEURON_TORCH_DEVICE_TYPE(Id, bytes, floating, name, ir, Torch, Device) \
  {at::k##Torch, rp::Device},
    NEURON_FORALL_DTYPES(NEURON_TORCH_DEVICE_TYPE)
#undef NEURON_TORCH_DEVICE_TYPE
};

const DeviceType& Find(at::ScalarType type, const std::string& where) {
  for (const auto& t : kTypes) {
    if (t.torch == type && t.device != rp::ELEMENT_TYPE_UNSPECIFIED) return t;
  }
  throw InvalidUsage(
      StrCat(where, ": dtype ", c10::toString(type), " is not supported on the device"));
}

}  // namespace

rp::ElementType ElementTypeOf(at::ScalarType type) {
  return Find(type, "compiled graph").device;
}

std::string IrDtypeOf(at::ScalarType type, const std::string& where) {
  return IrDtypeName(Find(type, where).device);
}

at::ScalarType ScalarTypeOf(rp::ElementType type) {
  for (const auto& t : kTypes) {
    if (t.device == type && type != rp::ELEMENT_TYPE_UNSPECIFIED) return t.torch;
  }
  return at::kBool;  // as before: what the table does not name is read as bytes of bool
}

runtime::HostView ViewOf(const at::Tensor& t, at::Tensor* held) {
  NEURON_CHECK((t.device().is_cpu() || t.device().is_privateuseone()) &&
                   t.layout() == at::kStrided,
               "compiled graph: inputs must be dense tensors on the CPU or the \"neuron\" "
               "device, got one on ", t.device().str());
  *held = t.contiguous();
  return {ElementTypeOf(held->scalar_type()),
          static_cast<const std::uint8_t*>(held->data_ptr()),
          static_cast<std::size_t>(held->numel()) * held->element_size()};
}

runtime::HostTensor ToHost(const at::Tensor& t) {
  at::Tensor c;
  const runtime::HostView v = ViewOf(t, &c);
  runtime::HostTensor h;
  h.dtype = v.dtype;
  h.shape.assign(c.sizes().begin(), c.sizes().end());
  h.data.assign(v.data, v.data + v.bytes);
  return h;
}

at::Tensor FromHost(const runtime::HostTensor& h, c10::Device device) {
  at::Tensor t =
      at::empty(h.shape, at::TensorOptions().dtype(ScalarTypeOf(h.dtype)).device(device));
  std::memcpy(t.data_ptr(), h.data.data(), h.data.size());
  return t;
}

at::Tensor FromHost(runtime::HostTensor&& h, c10::Device device) {
  // NEURON_SHARED_TENSORS=1 installs a CPU allocator whose tensors the
  // collectives register: those get a copy in its memory.
  const bool shared =
      runtime::ConfigRegistry::Get().GetInt(runtime::ConfigKey::kSharedTensors) != 0;
  if (!device.is_cpu() || shared || h.data.empty()) return FromHost(h, device);
  auto bytes = std::make_unique<runtime::HostBytes>(std::move(h.data));
  runtime::HostBytes* owned = bytes.get();
  at::Tensor t = at::from_blob(
      owned->data(), h.shape, [owned](void*) { delete owned; },
      at::TensorOptions().dtype(ScalarTypeOf(h.dtype)).device(device));
  bytes.release();  // the tensor's deleter owns it now
  return t;
}

}  // namespace neuron::compiler
