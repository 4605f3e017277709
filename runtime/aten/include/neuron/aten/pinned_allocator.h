// Pinned host memory for the "neuron" device: what Tensor.pin_memory()
// allocates and Tensor.is_pinned() recognises. Device memory here is host
// memory, so pinning is an ordinary CPU allocation; what matters is that a
// pinned tensor stays pinned (FSDP2's CPU offload re-pins, and so copies,
// any tensor is_pinned() denies, losing the optimizer's in-place updates).
//
// Usage:
//   c10::Allocator* a = PinnedAllocator();   // PrivateUse1Hooks' allocator
//   bool pinned = IsPinned(ptr);              // any byte of a live block
#pragma once

#include <c10/core/Allocator.h>

namespace neuron::aten {

// Process-wide; thread-safe.
c10::Allocator* PinnedAllocator();
// Whether `ptr` points into a live block of PinnedAllocator().
bool IsPinned(const void* ptr);

}  // namespace neuron::aten
