#include "neuron/c10d/shared_tensor_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <exception>
#include <mutex>

#include "neuron/collectives/transport/shared_buffers.h"

namespace neuron::c10d {

namespace {

using collectives::transport::SharedBufferPool;

// Torch frees in noexcept destructors: a failure is reported, not thrown.
void FreeShared(void* p) noexcept {
  try {
    SharedBufferPool::Instance().Free(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "neuron: freeing a shared tensor: %s\n", e.what());
  }
}

at::Allocator* fallback = nullptr;  // the allocator this one replaced

// For raw_allocate/raw_deallocate: either allocator's memory.
void RawDelete(void* p) {
  if (p == nullptr) return;
  if (SharedBufferPool::Instance().Holds(p)) {
    FreeShared(p);
  } else {
    fallback->raw_deallocate(p);
  }
}

class SharedTensorAllocator final : public at::Allocator {
 public:
  explicit SharedTensorAllocator(std::size_t min_bytes) : min_bytes_(min_bytes) {}

  at::DataPtr allocate(std::size_t n) override {
    if (n >= min_bytes_) {
      if (void* p = SharedBufferPool::Instance().Allocate(n)) {
        return {p, p, &FreeShared, at::Device(at::DeviceType::CPU)};
      }
    }
    return fallback->allocate(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  at::DeleterFnPtr raw_deleter() const override {
    return fallback->raw_deleter() != nullptr ? &RawDelete : nullptr;
  }

 private:
  std::size_t min_bytes_;
};

}  // namespace

void InstallSharedTensorAllocator(std::size_t min_bytes) {
  static std::once_flag once;
  std::call_once(once, [&] {
    fallback = c10::GetCPUAllocator();
    SharedBufferPool::Instance();  // made (and its fork handlers set) before any fork
    // Lives for the process: tensors it made may be freed at exit.
    static auto* allocator = new SharedTensorAllocator(min_bytes);
    c10::SetCPUAllocator(allocator);
  });
}

}  // namespace neuron::c10d
