// Torch CPU tensors in registered memory (collectives' SharedBufferPool), so
// that the direct allreduce on them reduces in place, with no staging: the
// analogue of PyTorch's NCCL tensor-register allocator hook.
//
// Once installed, every CPU allocation of at least `min_bytes` comes from
// the pool; smaller ones (and any the pool cannot make) from the allocator
// it replaced. Tensors allocated before stay where they are. Caveats, as
// for any shared mapping: a process forked afterwards shares (does not
// copy) these tensors' memory (and gets a disabled pool: its own large
// tensors are ordinary memory), and freed memory is kept for reuse (up to
// SharedBufferPool::kMaxFreeBytes).
//
// BackendNeuron installs it when NEURON_SHARED_TENSORS=1.
//
// Usage:
//   neuron::c10d::InstallSharedTensorAllocator();
//   auto grads = at::empty({1 << 20});  // registered
#pragma once

#include <cstddef>

namespace neuron::c10d {

inline constexpr std::size_t kSharedTensorMinBytes = std::size_t{1} << 20;

// Idempotent; the first call's `min_bytes` holds.
void InstallSharedTensorAllocator(std::size_t min_bytes = kSharedTensorMinBytes);

}  // namespace neuron::c10d
