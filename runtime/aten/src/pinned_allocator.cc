#include "neuron/aten/pinned_allocator.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

namespace neuron::aten {

namespace {

// Live blocks by start address: [start, start + size).
class PinnedBlocks {
 public:
  void Add(const void* p, std::size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[Address(p)] = size;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.erase(Address(p));
  }
  bool Contains(const void* p) const {
    const std::uintptr_t a = Address(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }

 private:
  static std::uintptr_t Address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::size_t> blocks_;
};

PinnedBlocks& Blocks() {
  static auto* blocks = new PinnedBlocks();  // outlives every tensor's deleter
  return *blocks;
}

void DeletePinned(void* p) {
  Blocks().Remove(p);
  std::free(p);
}

constexpr std::size_t kAlignment = 64;  // c10's CPU allocator's

class Pinned final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, &DeletePinned, c10::Device(c10::DeviceType::CPU)};
    TORCH_CHECK_WITH(OutOfMemoryError, bytes <= SIZE_MAX - kAlignment,
                     "pinned host memory: cannot allocate ", bytes, " bytes");
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr, "pinned host memory: could not allocate ",
                     bytes, " bytes");
    Blocks().Add(p, bytes);
    return {p, p, &DeletePinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeletePinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

c10::Allocator* PinnedAllocator() {
  static Pinned allocator;
  return &allocator;
}

bool IsPinned(const void* ptr) { return ptr != nullptr && Blocks().Contains(ptr); }

}  // namespace neuron::aten
