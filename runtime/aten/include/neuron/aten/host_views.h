// Tensors over the memory of other tensors: a "neuron" tensor's memory is
// host memory, so the CPU's kernels can read and write it through a CPU
// tensor with the same bytes and geometry, and a CPU kernel's result can
// become a neuron tensor without a copy.
//
// Usage:
//   c10::Storage cpu = HostStorage(neuron.storage(), /*resizable=*/false);
//   at::Tensor view = TensorOn(cpu, c10::DispatchKey::CPU, neuron);  // same sizes, strides
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

namespace neuron::aten {

// A CPU storage over the bytes of `storage` (which keeps owning them).
// Resizable: a kernel that resizes it gets new memory from the CPU's
// allocator (the caller adopts it); else a resize is refused.
c10::Storage HostStorage(const c10::Storage& storage, bool resizable);

// A tensor of dispatch key `key` on `storage`, with the dtype, sizes,
// strides and offset of `like`.
at::Tensor TensorOn(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like);

}  // namespace neuron::aten
