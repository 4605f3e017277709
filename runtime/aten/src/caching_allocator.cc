#include "neuron/aten/caching_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <algorithm>
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

// The aggregate allocated, reserved and active bytes of `t`.
MemoryLevels Levels(const c10::CachingDeviceAllocator::DeviceStats& t) {
  constexpr auto kAll = static_cast<std::size_t>(StatType::AGGREGATE);
  return {static_cast<std::uint64_t>(t.allocated_bytes[kAll].current),
          static_cast<std::uint64_t>(t.reserved_bytes[kAll].current),
          static_cast<std::uint64_t>(t.active_bytes[kAll].current)};
}

// The calling thread's current stream on device `index`.
c10::StreamId CurrentStream(c10::DeviceIndex index) {
  const c10::Device where(c10::DeviceType::PrivateUse1, index);
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getStream(where).id();
}

}  // namespace

const char* BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kActiveAllocated: return "active_allocated";
    case BlockState::kActivePendingFree: return "active_pending_free";
    case BlockState::kInactive: return "inactive";
  }
  return "inactive";
}

// One block of device memory: its host memory, either the allocator's own
// (cached when freed) or an adopted CPU storage's (released when freed).
struct CachingAllocator::Block {
  void* ptr = nullptr;
  std::uint64_t size = 0;  // rounded
  std::uint64_t requested = 0;
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;                 // current when allocated
  std::vector<c10::StreamId> stream_uses;   // other streams it was used on
  BlockState state = BlockState::kActiveAllocated;
  c10::Storage adopted;    // set for adopted memory

  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(ptr); }
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
    d.trace.Record({TraceAction::kSegmentFree, block->address(), size, block->stream});
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
    d.trace.Record({TraceAction::kOom, 0, size, CurrentStream(index), free});
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
  d.phases.Raise(Levels(d.torch_stats));
}

// A new block is allocated and active; it stops being allocated when its
// tensor frees it and active when no stream uses it any more (Release).
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
  d.phases.Raise(Levels(d.torch_stats));
}

CachingAllocator::Block* CachingAllocator::Take(c10::DeviceIndex index, std::uint64_t size,
                                                std::uint64_t requested,
                                                c10::StreamId stream) {
  std::vector<c10::Storage> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  Device& d = device(index);
  ProcessEventsLocked(d, dropped);
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
    d.trace.Record({TraceAction::kSegmentAlloc, block->address(), size, stream});
  }
  block->requested = requested;
  block->stream = stream;
  block->state = BlockState::kActiveAllocated;
  d.active.insert(block);
  d.trace.Record({TraceAction::kAlloc, block->address(), requested, stream});
  CountAllocationLocked(d, size, requested);
  return block;
}

c10::DataPtr CachingAllocator::allocate(std::size_t bytes) {
  const c10::DeviceIndex index = CurrentDevice();
  const c10::Device where(c10::DeviceType::PrivateUse1, index);
  if (bytes == 0) return c10::DataPtr(nullptr, where);
  Block* block = Take(index, RoundedSize(bytes), bytes, CurrentStream(index));
  return c10::DataPtr(block->ptr, block, &CachingAllocator::Delete, where);
}

c10::DataPtr CachingAllocator::Adopt(c10::Storage storage, c10::DeviceIndex index) {
  const std::uint64_t size = storage.nbytes();
  auto* block = new Block;
  block->ptr = storage.mutable_data();
  block->size = size;
  block->device = index;
  block->requested = size;
  block->stream = CurrentStream(index);
  block->adopted = std::move(storage);
  std::vector<c10::Storage> dropped;  // released after the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Device& d = device(index);
    ProcessEventsLocked(d, dropped);
    try {
      ReserveLocked(d, index, size);
    } catch (...) {
      delete block;  // the storage is dropped with it
      throw;
    }
    d.active.insert(block);
    d.trace.Record({TraceAction::kSegmentAlloc, block->address(), size, block->stream});
    d.trace.Record({TraceAction::kAlloc, block->address(), size, block->stream});
    CountAllocationLocked(d, size, size);
  }
  return c10::DataPtr(block->ptr, block, &CachingAllocator::Delete,
                      c10::Device(c10::DeviceType::PrivateUse1, index));
}

// As CUDA's free: allocated drops now; active drops when the block is
// free of stream use (FreeBlockLocked), at once or at the next
// ProcessEventsLocked.
void CachingAllocator::Release(Block* block) {
  std::vector<c10::Storage> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  Device& d = device(block->device);
  d.stats.allocated -= block->size;
  d.allocated.store(d.stats.allocated, std::memory_order_relaxed);
  ++d.stats.frees;
  Count(d.torch_stats.allocation, block->size, -1);
  Count(d.torch_stats.allocated_bytes, block->size, -Signed(block->size));
  d.trace.Record({TraceAction::kFreeRequested, block->address(), block->requested, block->stream});
  if (block->stream_uses.empty()) {
    FreeBlockLocked(d, block, dropped);
  } else {
    block->state = BlockState::kActivePendingFree;
    d.pending.push_back(block);
  }
}

void CachingAllocator::FreeBlockLocked(Device& d, Block* block,
                                       std::vector<c10::Storage>& dropped) {
  auto& t = d.torch_stats;
  d.trace.Record({TraceAction::kFreeCompleted, block->address(), block->requested, block->stream});
  Count(t.active, block->size, -1);
  Count(t.active_bytes, block->size, -Signed(block->size));
  Count(t.requested_bytes, block->size, -Signed(block->requested));
  d.active.erase(block);
  block->stream_uses.clear();
  if (block->adopted) {
    d.stats.reserved -= block->size;
    Count(t.segment, block->size, -1);
    Count(t.reserved_bytes, block->size, -Signed(block->size));
    ++t.num_device_free;
    d.trace.Record({TraceAction::kSegmentFree, block->address(), block->size, block->stream});
    dropped.push_back(std::move(block->adopted));
    delete block;
  } else {
    block->state = BlockState::kInactive;
    block->requested = 0;
    d.cache.emplace(block->size, block);
  }
}

// CUDA queries each pending block's events here; every stream's work is
// done once issued, so every pending block is free.
void CachingAllocator::ProcessEventsLocked(Device& d, std::vector<c10::Storage>& dropped) {
  for (Block* block : d.pending) FreeBlockLocked(d, block, dropped);
  d.pending.clear();
}

void CachingAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get_deleter() != &CachingAllocator::Delete) return;
  auto* block = static_cast<Block*>(ptr.get_context());
  std::lock_guard<std::mutex> lock(mutex_);
  if (stream.id() == block->stream) return;  // its own stream needs no wait
  auto& uses = block->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream.id()) == uses.end()) {
    uses.push_back(stream.id());
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
  std::vector<c10::Storage> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < device_count_; ++i) {
    ProcessEventsLocked(devices_[i], dropped);
    FreeCachedLocked(devices_[i]);
  }
}

std::vector<BlockInfo> CachingAllocator::Blocks() const {
  std::vector<BlockInfo> out;
  auto info = [&out](const Block* b) {
    out.push_back({b->device, b->address(), b->size,
                   b->requested, b->stream, b->state});
  };
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < device_count_; ++i) {
    for (const Block* b : devices_[i].active) info(b);
    for (const auto& [size, b] : devices_[i].cache) info(b);
  }
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) {
    return a.device != b.device ? a.device < b.device : a.address < b.address;
  });
  return out;
}

std::string CachingAllocator::SetPhase(c10::DeviceIndex index, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  Device& d = device(CheckIndex(index, "set_memory_phase"));
  return d.phases.Enter(phase, Levels(d.torch_stats));
}

void CachingAllocator::RecordHistory(std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < device_count_; ++i) {
    if (max_entries == 0) {
      devices_[i].trace.Disable();
    } else {
      devices_[i].trace.Enable(max_entries);
    }
  }
}

std::vector<std::vector<TraceEntry>> CachingAllocator::Traces() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<TraceEntry>> out;
  for (int i = 0; i < device_count_; ++i) out.push_back(devices_[i].trace.Entries());
  return out;
}

std::vector<PhasePeak> CachingAllocator::PhasePeaks(c10::DeviceIndex index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return device(CheckIndex(index, "memory_phase_peaks")).phases.Peaks();
}

}  // namespace neuron::aten
