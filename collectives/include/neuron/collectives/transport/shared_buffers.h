// Buffers that every process on this host can map: the collectives' form of
// NCCL's registered user buffers (ncclMemAlloc / ncclCommRegister).
//
// SharedBufferPool hands out memory backed by memfd segments. A peer process
// maps a segment by opening /proc/<owner pid>/fd/<fd> (same user, no name in
// /dev/shm, so nothing is left behind when a rank is killed). The direct
// allreduce then reduces straight from every rank's own buffer and copies
// the result straight out of them: no staging copy in or out (about 3 bytes
// of memory traffic per byte of buffer instead of 5).
//
// Segments are kept for the life of the process once made: a freed buffer's
// segment is reused by the next allocation of its size class. So a peer's
// mapping of (pid, fd, inode) stays valid as long as the owner lives.
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
  // The process's pool (torch's allocator and every communicator share it).
  static SharedBufferPool& Instance();

  // `bytes` (> 0) of page-aligned shared memory, or nullptr when no segment
  // can be made (out of file descriptors or memory): the caller falls back
  // to ordinary memory and the collectives to staging.
  void* Allocate(std::size_t bytes);
  // Returns memory from Allocate for reuse. InvalidUsage for other pointers.
  void Free(void* p);
  // The region of [p, p + bytes) when it lies inside one live allocation.
  std::optional<SharedRegion> Find(const void* p, std::size_t bytes) const;

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
  };
  SharedBufferPool() = default;

  mutable std::mutex mutex_;
  std::map<const char*, Segment> segments_;              // by base address
  std::multimap<std::size_t, const char*> free_by_size_;  // free segments
  std::size_t bytes_mapped_ = 0;
};

// A communicator's mappings of its peers' segments, made on first use and
// unmapped when it is destroyed. Not thread-safe (one communicator thread).
class PeerBufferMap {
 public:
  PeerBufferMap() = default;
  ~PeerBufferMap();
  PeerBufferMap(const PeerBufferMap&) = delete;
  PeerBufferMap& operator=(const PeerBufferMap&) = delete;

  // The address of `region`'s buffer in this process. The owner's own
  // address when this process is the owner. Throws IoError naming the
  // process and descriptor when the segment cannot be opened or mapped.
  char* Map(const SharedRegion& region);

 private:
  struct Mapping {
    std::int32_t pid;
    std::int32_t fd;
    std::uint64_t inode;
    char* base;
    std::size_t bytes;
  };
  std::vector<Mapping> mappings_;
};

}  // namespace neuron::collectives::transport
