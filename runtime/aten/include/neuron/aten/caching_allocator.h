// The "neuron" device's memory: host memory behind a caching allocator that
// accounts every block against its device's HBM capacity, with CUDA's
// caching-allocator meaning of the counters (torch.cuda.memory_stats):
// reserved = bytes of blocks the allocator holds, live or cached;
// allocated = bytes of live blocks (not yet freed by their tensors);
// active = allocated plus the freed blocks still waiting on stream use
// (recordStream), which are not reusable yet; each with its peak.
//
// Usage:
//   CachingAllocator& a = CachingAllocator::Get();
//   c10::DataPtr p = a.allocate(1 << 20);        // on the current device
//   DeviceMemoryStats s = a.Stats(0);
//   a.EmptyCache();                              // frees cached blocks
//   c10::DataPtr q = a.Adopt(std::move(cpu_storage), 0);  // a CPU kernel's output
//
// Sizes round up to 512 B (below 1 MiB) or to 2 MiB; a freed block waits in
// its device's cache for a request of the same rounded size. Blocks are
// never split: each is one segment, so inactive_split is always 0.
//
// Stream use, as in CUDA's caching allocator: a block remembers the stream
// current when it was allocated; recordStream(ptr, s) on another stream
// marks it used there. Freeing a block so marked takes it out of allocated
// at once but keeps it active ("active_pending_free") until the allocator
// next processes its events: at the next allocation on its device (allocate
// or Adopt) or at EmptyCache. Work on every stream is complete once issued
// (operations are synchronous), so that is the first moment it becomes
// reusable.
//
// A request that would take reserved past the capacity first empties the
// cache, then throws c10::OutOfMemoryError naming the request, the
// capacity, what is free, and the allocated and reserved bytes. Blocks()
// lists every block (memory_snapshot), SetPhase/PhasePeaks keep peaks per
// named phase (memory_phases.h), RecordHistory/Traces the allocation
// history (memory_trace.h). Thread-safe.
//
// It is PyTorch's allocator of the device (c10::GetAllocator(PrivateUse1):
// storages made on "neuron", torch.UntypedStorage, torch.load) and a
// c10::DeviceAllocator, so torch.accelerator's memory calls read the same
// counters as torch.neuron's (getDeviceStats: CUDA's statistics, with the
// small pool holding blocks under 1 MiB and the large pool the rest).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "neuron/aten/memory_phases.h"
#include "neuron/aten/memory_trace.h"

namespace neuron::aten {

struct DeviceMemoryStats {
  std::uint64_t allocated = 0;
  std::uint64_t reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t allocations = 0;  // blocks handed out (cached or new)
  std::uint64_t frees = 0;
  std::uint64_t cache_hits = 0;
  std::uint64_t ooms = 0;
  std::uint64_t capacity = 0;
};

// A block's state under torch.cuda.memory_snapshot()'s names.
enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };
const char* BlockStateName(BlockState state);

// One block (= one segment) as memory_snapshot() shows it.
struct BlockInfo {
  c10::DeviceIndex device = 0;
  std::uintptr_t address = 0;
  std::uint64_t size = 0;       // rounded (the segment's total size)
  std::uint64_t requested = 0;  // bytes asked for (0 when inactive)
  c10::StreamId stream = 0;     // the stream it was allocated on
  BlockState state = BlockState::kInactive;
};

class CachingAllocator final : public c10::DeviceAllocator {
 public:
  static CachingAllocator& Get();

  c10::DataPtr allocate(std::size_t bytes) override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // c10::DeviceAllocator (torch.accelerator): always initialized; the
  // statistics are torch.neuron.memory_stats()'s.
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override { EmptyCache(); }
  // Marks `ptr`'s block used on `stream` (Tensor.record_stream): freeing
  // it then waits for the stream (see above). Ignored for the block's own
  // stream and for memory this allocator did not hand out.
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // (free, total): the capacity less what the allocator reserves.
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Takes over a CPU storage's memory as memory of device `device`, without
  // copying: the returned DataPtr keeps `storage` alive, and its bytes count
  // as allocated and reserved until it is freed (OutOfMemoryError when they
  // do not fit). Adopted memory is not cached.
  c10::DataPtr Adopt(c10::Storage storage, c10::DeviceIndex device);

  DeviceMemoryStats Stats(c10::DeviceIndex device) const;
  // The allocated bytes of `device` without taking the lock (for per-op
  // records; may lag a concurrent change).
  std::uint64_t Allocated(c10::DeviceIndex device) const;
  void ResetPeaks(c10::DeviceIndex device);
  // Completes the frees waiting on streams, then returns every cached block
  // of every device to the system.
  void EmptyCache();

  // Every block of every device, live, pending or cached, by device and
  // address (torch.cuda.memory_snapshot()'s segments).
  std::vector<BlockInfo> Blocks() const;

  // Makes `phase` the current memory phase of `device` (empty: none) and
  // returns the previous one; PhasePeaks gives each phase's peak levels
  // (see memory_phases.h). Not changed by ResetPeaks.
  std::string SetPhase(c10::DeviceIndex device, const std::string& phase);
  std::vector<PhasePeak> PhasePeaks(c10::DeviceIndex device) const;

  // Records every device's allocation history, keeping the last
  // `max_entries` per device; 0 stops recording and drops it
  // (torch.cuda.memory._record_memory_history, without stack frames).
  void RecordHistory(std::size_t max_entries);
  // Each device's recorded history, oldest first (empty when not recording).
  std::vector<std::vector<TraceEntry>> Traces() const;

  // The rounded size a request of `bytes` takes.
  static std::uint64_t RoundedSize(std::uint64_t bytes);

 private:
  struct Block;
  struct Device {
    DeviceMemoryStats stats;
    c10::CachingDeviceAllocator::DeviceStats torch_stats;  // PyTorch's form of the same
    std::atomic<std::uint64_t> allocated{0};  // stats.allocated, readable without the lock
    std::multimap<std::uint64_t, Block*> cache;  // rounded size -> free block
    std::unordered_set<Block*> active;  // allocated or pending blocks
    std::vector<Block*> pending;        // freed, waiting on stream use
    MemoryPhases phases;
    MemoryTrace trace;
  };

  CachingAllocator();  // one Device per device of the Inventory
  Device& device(c10::DeviceIndex index) const;
  Block* Take(c10::DeviceIndex index, std::uint64_t size, std::uint64_t requested,
             c10::StreamId stream);
  // Counts `size` more reserved bytes, emptying the cache or throwing
  // OutOfMemoryError when they would pass the capacity.
  void ReserveLocked(Device& d, c10::DeviceIndex index, std::uint64_t size);
  void CountAllocationLocked(Device& d, std::uint64_t size, std::uint64_t requested);
  void Release(Block* block);
  // Takes a freed block out of active: back to the cache, or, adopted, its
  // storage moved to `dropped` (released after the lock).
  void FreeBlockLocked(Device& d, Block* block, std::vector<c10::Storage>& dropped);
  // Frees the blocks whose stream use is over: all of them (see above).
  void ProcessEventsLocked(Device& d, std::vector<c10::Storage>& dropped);
  void FreeCachedLocked(Device& d);
  static void Delete(void* context);

  mutable std::mutex mutex_;  // every Device's stats and cache
  const int device_count_;
  const std::unique_ptr<Device[]> devices_;
};

}  // namespace neuron::aten
