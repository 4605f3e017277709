#include "neuron/aten/host_views.h"

#include <c10/core/CPUAllocator.h>

namespace neuron::aten {

c10::Storage HostStorage(const c10::Storage& storage, bool resizable) {
  void* base = storage.nbytes() == 0 ? nullptr : storage.mutable_data();
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                      c10::DataPtr(base, c10::Device(c10::DeviceType::CPU)),
                      resizable ? c10::GetCPUAllocator() : nullptr, resizable);
}

at::Tensor TensorOn(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

}  // namespace neuron::aten
