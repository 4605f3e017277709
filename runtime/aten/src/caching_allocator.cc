#include "neuron/aten/caching_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "neuron/aten/devices.h"

namespace neuron::aten {
namespace {

constexpr std::uint64_t kSmallLimit = 1 << 20;     // 1 MiB
constexpr std::uint64_t kSmallRound = 512;
constexpr std::uint64_t kLargeRound = 2 << 20;     // 2 MiB

std::string Bytes(std::uint64_t n) {
  char text[64];
  const double v = static_cast<double>(n);
  if (n >= (1ull << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", v / (1ull << 30));
  } else if (n >= (1ull << 20)) {
    std::snprintf(text, sizeof(text), "%.2f MiB", v / (1ull << 20));
  } else {
    std::snprintf(text, sizeof(text), "%.2f KiB", v / 1024);
  }
  return text;
}

using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

// Adds `amount` (negative: removes) to the aggregate and to the pool of a
// block of `size` bytes: the small pool holds the blocks of requests under
// 1 MiB, whose rounded sizes are at most 1 MiB.
void Count(StatArray& stats, std::uint64_t size, std::int64_t amount) {
  const auto pool = size <= kSmallLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL;
  for (const StatType type : {StatType::AGGREGATE, pool}) {
    auto& stat = stats[static_cast<std::size_t>(type)];
    if (amount >= 0) {
      stat.increase(static_cast<std::size_t>(amount));
    } else {
      stat.decrease(static_cast<std::size_t>(-amount));
    }
  }
}

std::int64_t Signed(std::uint64_t n) { return static_cast<std::int64_t>(n); }

}  // namespace

// One block of device memory: its host memory, either the allocator's own
// (cached when freed) or an adopted CPU storage's (released when freed).
struct CachingAllocator::Block {
  void* ptr = nullptr;
  std::uint64_t size = 0;  // rounded
  std::uint64_t requested = 0;
  c10::DeviceIndex device = 0;
  c10::Storage adopted;    // set for adopted memory
};

CachingAllocator& CachingAllocator::Get() {
  static CachingAllocator* allocator = new CachingAllocator();  // lives past exit
  return *allocator;
}

std::uint64_t CachingAllocator::RoundedSize(std::uint64_t bytes) {
  if (bytes == 0) return 0;
  const std::uint64_t round = bytes < kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + round - 1) / round * round;
}

CachingAllocator::CachingAllocator()
    : device_count_(Inventory().count),
      devices_(std::make_unique<Device[]>(static_cast<std::size_t>(device_count_))) {
  for (int i = 0; i < device_count_; ++i) devices_[i].stats.capacity = Inventory().capacity_bytes;
}

CachingAllocator::Device& CachingAllocator::device(c10::DeviceIndex index) const {
  return devices_[static_cast<std::size_t>(index)];
}

std::uint64_t CachingAllocator::Allocated(c10::DeviceIndex index) const {
  return device(index).allocated.load(std::memory_order_relaxed);
}

void CachingAllocator::FreeCachedLocked(Device& d) {
  for (auto& [size, block] : d.cache) {
    c10::free_cpu(block->ptr);
    d.stats.reserved -= size;
    Count(d.torch_stats.segment, size, -1);
    Count(d.torch_stats.reserved_bytes, size, -Signed(size));
    ++d.torch_stats.num_device_free;
    delete block;
  }
  d.cache.clear();
}

void CachingAllocator::ReserveLocked(Device& d, c10::DeviceIndex index, std::uint64_t size) {
  if (d.stats.reserved + size > d.stats.capacity) FreeCachedLocked(d);
  if (d.stats.reserved + size > d.stats.capacity) {
    ++d.stats.ooms;
    ++d.torch_stats.num_ooms;
    const std::uint64_t free = d.stats.capacity - d.stats.reserved;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
                     Bytes(size), ". Device neuron:", static_cast<int>(index),
                     " has a total capacity of ", Bytes(d.stats.capacity), " of which ",
                     Bytes(free), " is free. Of the allocated memory ", Bytes(d.stats.allocated),
                     " is allocated by PyTorch, and ", Bytes(d.stats.reserved - d.stats.allocated),
                     " is reserved by PyTorch but unallocated.");
  }
  d.stats.reserved += size;
  d.stats.peak_reserved = std::max(d.stats.peak_reserved, d.stats.reserved);
  Count(d.torch_stats.segment, size, 1);
  Count(d.torch_stats.reserved_bytes, size, Signed(size));
  ++d.torch_stats.num_device_alloc;
}

// A block is active exactly while it is allocated: operations are
// synchronous, so no stream holds a freed block.
void CachingAllocator::CountAllocationLocked(Device& d, std::uint64_t size,
                                             std::uint64_t requested) {
  d.stats.allocated += size;
  d.allocated.store(d.stats.allocated, std::memory_order_relaxed);
  d.stats.peak_allocated = std::max(d.stats.peak_allocated, d.stats.allocated);
  ++d.stats.allocations;
  auto& t = d.torch_stats;
  Count(t.allocation, size, 1);
  Count(t.active, size, 1);
  Count(t.allocated_bytes, size, Signed(size));
  Count(t.active_bytes, size, Signed(size));
  Count(t.requested_bytes, size, Signed(requested));
}

CachingAllocator::Block* CachingAllocator::Take(c10::DeviceIndex index, std::uint64_t size,
                                                std::uint64_t requested) {
  std::lock_guard<std::mutex> lock(mutex_);
  Device& d = device(index);
  Block* block = nullptr;
  auto cached = d.cache.find(size);
  if (cached != d.cache.end()) {
    block = cached->second;
    d.cache.erase(cached);
    ++d.stats.cache_hits;
  } else {
    ReserveLocked(d, index, size);
    block = new Block;
    block->ptr = c10::alloc_cpu(size);
    block->size = size;
    block->device = index;
  }
  block->requested = requested;
  CountAllocationLocked(d, size, requested);
  return block;
}

c10::DataPtr CachingAllocator::allocate(std::size_t bytes) {
  const c10::DeviceIndex index = CurrentDevice();
  const c10::Device where(c10::DeviceType::PrivateUse1, index);
  if (bytes == 0) return c10::DataPtr(nullptr, where);
  Block* block = Take(index, RoundedSize(bytes), bytes);
  return c10::DataPtr(block->ptr, block, &CachingAllocator::Delete, where);
}

c10::DataPtr CachingAllocator::Adopt(c10::Storage storage, c10::DeviceIndex index) {
  const std::uint64_t size = storage.nbytes();
  auto* block = new Block;
  block->ptr = storage.mutable_data();
  block->size = size;
  block->device = index;
  block->requested = size;
  block->adopted = std::move(storage);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Device& d = device(index);
    try {
      ReserveLocked(d, index, size);
    } catch (...) {
      delete block;  // the storage is dropped with it
      throw;
    }
    CountAllocationLocked(d, size, size);
  }
  return c10::DataPtr(block->ptr, block, &CachingAllocator::Delete,
                      c10::Device(c10::DeviceType::PrivateUse1, index));
}

void CachingAllocator::Release(Block* block) {
  c10::Storage adopted;  // dropped outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Device& d = device(block->device);
    d.stats.allocated -= block->size;
    d.allocated.store(d.stats.allocated, std::memory_order_relaxed);
    ++d.stats.frees;
    auto& t = d.torch_stats;
    Count(t.allocation, block->size, -1);
    Count(t.active, block->size, -1);
    Count(t.allocated_bytes, block->size, -Signed(block->size));
    Count(t.active_bytes, block->size, -Signed(block->size));
    Count(t.requested_bytes, block->size, -Signed(block->requested));
    if (block->adopted) {
      d.stats.reserved -= block->size;
      Count(t.segment, block->size, -1);
      Count(t.reserved_bytes, block->size, -Signed(block->size));
      ++t.num_device_free;
      adopted = std::move(block->adopted);
      delete block;
    } else {
      d.cache.emplace(block->size, block);
    }
  }
}

void CachingAllocator::Delete(void* context) {
  Get().Release(static_cast<Block*>(context));
}

void CachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

DeviceMemoryStats CachingAllocator::Stats(c10::DeviceIndex index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device(index).stats;
}

void CachingAllocator::ResetPeaks(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceMemoryStats& s = device(index).stats;
  s.peak_allocated = s.allocated;
  s.peak_reserved = s.reserved;
  auto& t = device(index).torch_stats;
  for (StatArray* a : {&t.allocation, &t.segment, &t.active, &t.inactive_split,
                       &t.allocated_bytes, &t.reserved_bytes, &t.active_bytes,
                       &t.inactive_split_bytes, &t.requested_bytes}) {
    for (auto& stat : *a) stat.reset_peak();
  }
  t.oversize_allocations.reset_peak();
  t.oversize_segments.reset_peak();
}

void CachingAllocator::resetPeakStats(c10::DeviceIndex index) {
  ResetPeaks(CheckIndex(index, "reset_peak_memory_stats"));
}

void CachingAllocator::resetAccumulatedStats(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& t = device(CheckIndex(index, "reset_accumulated_memory_stats")).torch_stats;
  for (StatArray* a : {&t.allocation, &t.segment, &t.active, &t.inactive_split,
                       &t.allocated_bytes, &t.reserved_bytes, &t.active_bytes,
                       &t.inactive_split_bytes, &t.requested_bytes}) {
    for (auto& stat : *a) stat.reset_accumulated();
  }
  t.num_alloc_retries = 0;
  t.num_ooms = 0;
  t.num_sync_all_streams = 0;
  t.num_device_alloc = 0;
  t.num_device_free = 0;
}

c10::CachingDeviceAllocator::DeviceStats CachingAllocator::getDeviceStats(
    c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(mutex_);
  return device(CheckIndex(index, "memory_stats")).torch_stats;
}

std::pair<std::size_t, std::size_t> CachingAllocator::getMemoryInfo(c10::DeviceIndex index) {
  const DeviceMemoryStats s = Stats(CheckIndex(index, "get_memory_info"));
  return {s.capacity - s.reserved, s.capacity};
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < device_count_; ++i) FreeCachedLocked(devices_[i]);
}

}  // namespace neuron::aten
