#include "neuron/c10d/shared_tensor_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>

#include "neuron/collectives/transport/shared_buffers.h"

namespace neuron::c10d {

namespace {

using collectives::transport::SharedBufferPool;

void FreeShared(void* p) { SharedBufferPool::Instance().Free(p); }

class SharedTensorAllocator final : public at::Allocator {
 public:
  SharedTensorAllocator(at::Allocator* fallback, std::size_t min_bytes)
      : fallback_(fallback), min_bytes_(min_bytes) {}

  at::DataPtr allocate(std::size_t n) const override {
    if (n >= min_bytes_) {
      if (void* p = SharedBufferPool::Instance().Allocate(n)) {
        return {p, p, &FreeShared, at::Device(at::DeviceType::CPU)};
      }
    }
    return fallback_->allocate(n);
  }

 private:
  at::Allocator* fallback_;
  std::size_t min_bytes_;
};

std::atomic<bool> installed{false};

}  // namespace

void InstallSharedTensorAllocator(std::size_t min_bytes) {
  static std::once_flag once;
  std::call_once(once, [&] {
    // Lives for the process: tensors it made may be freed at exit.
    static auto* allocator = new SharedTensorAllocator(c10::GetCPUAllocator(), min_bytes);
    c10::SetCPUAllocator(allocator);
    installed.store(true);
  });
}

bool SharedTensorAllocatorInstalled() { return installed.load(); }

}  // namespace neuron::c10d
