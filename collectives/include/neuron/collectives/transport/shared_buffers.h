// Buffers that every process on this host can map: the collectives' form of
// NCCL's registered user buffers (ncclMemAlloc / ncclCommRegister).
//
// SharedBufferPool hands out memory backed by memfd segments. A peer process
// maps a segment by opening /proc/<owner pid>/fd/<fd> (same user, no name in
// /dev/shm, so nothing is left behind when a rank is killed). The direct
// allreduce then reduces straight from every rank's own buffer and writes
// the result straight into them: each rank reads and writes its buffer's
// size once, against about five times that when staging.
//
// A freed buffer's segment is kept for the next allocation of its size
// class, up to kMaxFreeBytes of free segments; beyond, the largest other
// free segments are closed and unmapped (a peer tells the next segment
// behind a reused descriptor by its inode). The pool makes at most a
// quarter of the process's open-file limit in segments: at that limit it
// releases a free segment to make a new one, or, with none free, returns
// null (the caller falls back to ordinary memory).
//
// fork(): a child process gets a disabled pool (Allocate returns null, Find
// finds nothing, nothing is reused), so it never hands out memory its parent
// also uses; and the parent never reuses a segment that was live at the
// fork (freed, it is released), so no new buffer of the parent's aliases
// one a child still holds. Buffers the child inherited stay mapped shared
// with the parent, as any MAP_SHARED memory does: writes on either side are
// seen by the other.
//
// Usage:
//   auto& pool = SharedBufferPool::Instance();
//   void* p = pool.Allocate(bytes);       // nullptr: use ordinary memory
//   if (auto where = pool.Find(p, bytes)) { ... peers: PeerBufferMap::Map(*where) }
//   pool.Free(p);
// The c10d backend allocates torch's large CPU tensors here when
// NEURON_SHARED_TENSORS=1; neuron-cc-perf --registered allocates its buffers.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace neuron::collectives::transport {

// Where a buffer lives, in terms another process on this host can map:
// the buffer starts `offset` bytes into segment `fd` of process `pid`,
// which maps the segment at `owner_base`. Plain data: it travels in the
// collectives' header slots.
struct SharedRegion {
  std::int32_t pid = 0;
  std::int32_t fd = -1;
  std::uint64_t inode = 0;  // tells a reused fd number from the segment we mapped
  std::uint64_t segment_bytes = 0;
  std::uint64_t offset = 0;
  std::uint64_t owner_base = 0;
};

class SharedBufferPool {
 public:
  static constexpr std::size_t kMaxFreeBytes = std::size_t{1} << 30;

  // The process's pool (torch's allocator and every communicator share it;
  // the communicators look buffers up here).
  static SharedBufferPool& Instance();
  // A pool of one's own (tests); closes its segments when destroyed.
  explicit SharedBufferPool(std::size_t max_free_bytes = kMaxFreeBytes)
      : max_free_bytes_(max_free_bytes) {}
  ~SharedBufferPool();
  SharedBufferPool(const SharedBufferPool&) = delete;
  SharedBufferPool& operator=(const SharedBufferPool&) = delete;

  // `bytes` (> 0) of page-aligned shared memory, or nullptr when no segment
  // can be made (the segment limit, out of memory, or a forked child): the
  // caller falls back to ordinary memory and the collectives to staging.
  void* Allocate(std::size_t bytes);
  // Returns memory from Allocate for reuse. InvalidUsage for other pointers.
  void Free(void* p);
  // The region of [p, p + bytes) when it lies inside one live allocation.
  std::optional<SharedRegion> Find(const void* p, std::size_t bytes) const;
  // Whether `p` starts a live allocation of this pool (a forked child's
  // inherited ones included).
  bool Holds(const void* p) const;
  // Whether this pool maps segment (fd, inode) at `base` (a region this
  // process published itself).
  bool Owns(std::int32_t fd, std::uint64_t inode, std::uint64_t base) const;

  // Counters for tests and docs.
  std::size_t segments() const;
  std::size_t bytes_mapped() const;

 private:
  struct Segment {
    char* base = nullptr;
    std::size_t bytes = 0;
    int fd = -1;
    std::uint64_t inode = 0;
    std::size_t used = 0;  // bytes of the live allocation (0: free)
    bool forked = false;   // live at a fork: a child may hold it, never reuse
  };
  void Release(std::map<const char*, Segment>::iterator it);  // mutex_ held
  void ReleaseFree(std::multimap<std::size_t, const char*>::iterator it);  // mutex_ held
  static void MarkForked();      // pthread_atfork, parent: see "fork()" above
  static void DisableInChild();  // pthread_atfork, child

  mutable std::mutex mutex_;
  std::map<const char*, Segment> segments_;              // by base address
  std::multimap<std::size_t, const char*> free_by_size_;  // free segments
  std::size_t bytes_mapped_ = 0;
  std::size_t free_bytes_ = 0;
  std::size_t max_free_bytes_ = kMaxFreeBytes;
  // Live allocations, read without the lock: Find on every large allreduce
  // returns at once while nothing is registered (the usual case).
  std::atomic<std::size_t> live_{0};
  bool disabled_ = false;  // a forked child's
};

// A communicator's mappings of its peers' segments, made on first use and
// unmapped when it is destroyed, when the peer's descriptor is found to hold
// another segment, or when a sweep finds the owner released the segment.
// SweepIfDue sweeps once the mapped bytes have grown past twice what the
// last sweep left (at least `sweep_bytes`): one stat of the owner's
// descriptor per mapping, so a long job whose peers release segments
// (buffers of changing sizes, a pool over its cap) does not keep their
// memory alive. Not thread-safe (one communicator thread).
class PeerBufferMap {
 public:
  static constexpr std::size_t kSweepBytes = std::size_t{256} << 20;

  explicit PeerBufferMap(std::size_t sweep_bytes = kSweepBytes)
      : min_sweep_bytes_(sweep_bytes), sweep_at_bytes_(sweep_bytes) {}
  ~PeerBufferMap();
  PeerBufferMap(const PeerBufferMap&) = delete;
  PeerBufferMap& operator=(const PeerBufferMap&) = delete;

  // The address of `region`'s buffer in this process: the owner's own
  // address when this process's pool owns the segment. Throws IoError
  // naming the process and descriptor when it cannot be opened or mapped.
  char* Map(const SharedRegion& region);
  // Unmaps the mappings whose owner no longer holds their segment behind
  // their descriptor (released, or the owner gone), when due (see above).
  // Only between operations: never while addresses Map returned are in use
  // (an owner that failed may have released the segment under them).
  void SweepIfDue();

  // Peers' segments mapped now, and their bytes (tests, docs).
  std::size_t mappings() const { return mappings_.size(); }
  std::size_t bytes_mapped() const;

 private:
  struct Mapping {
    std::int32_t pid;
    std::int32_t fd;
    std::uint64_t inode;
    char* base;
    std::size_t bytes;
  };
  std::vector<Mapping>::iterator Unmap(std::vector<Mapping>::iterator it);

  std::vector<Mapping> mappings_;
  std::size_t min_sweep_bytes_;
  std::size_t sweep_at_bytes_;
};

}  // namespace neuron::collectives::transport
