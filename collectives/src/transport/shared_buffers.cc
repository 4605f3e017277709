#include "neuron/collectives/transport/shared_buffers.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::collectives::transport {

namespace {

constexpr std::size_t kPage = 4096;

// Page-rounded, then up to one of 8 classes per power of two (at most 12.5%
// waste), so buffers of nearly equal size share freed segments.
std::size_t SizeClass(std::size_t bytes) {
  std::size_t n = (bytes + kPage - 1) / kPage * kPage;
  int top = 63 - __builtin_clzll(n);
  const std::size_t step = top > 15 ? std::size_t{1} << (top - 3) : kPage;
  return (n + step - 1) / step * step;
}

}  // namespace

SharedBufferPool& SharedBufferPool::Instance() {
  static SharedBufferPool* pool = [] {
    auto* p = new SharedBufferPool();  // never destroyed: torch frees tensors late
    // fork(): the child must not hand out segments its parent also uses,
    // and must not inherit the mutex locked by another thread.
    ::pthread_atfork([] { Instance().mutex_.lock(); }, &SharedBufferPool::MarkForked,
                     &SharedBufferPool::DisableInChild);
    return p;
  }();
  return *pool;
}

void SharedBufferPool::MarkForked() {
  SharedBufferPool& pool = Instance();
  for (auto& [base, s] : pool.segments_) {
    if (s.used > 0) s.forked = true;
  }
  pool.mutex_.unlock();
}

void SharedBufferPool::DisableInChild() {
  SharedBufferPool& pool = Instance();
  pool.disabled_ = true;
  pool.free_by_size_.clear();
  pool.free_bytes_ = 0;
  pool.mutex_.unlock();
}

SharedBufferPool::~SharedBufferPool() {
  for (auto& [base, s] : segments_) {
    ::munmap(s.base, s.bytes);
    ::close(s.fd);
  }
}

void* SharedBufferPool::Allocate(std::size_t bytes) {
  NEURON_CHECK(bytes > 0, "shared buffer of 0 bytes");
  const std::size_t size = SizeClass(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (disabled_) return nullptr;
  if (auto it = free_by_size_.find(size); it != free_by_size_.end()) {
    Segment& s = segments_.at(it->second);
    free_by_size_.erase(it);
    free_bytes_ -= s.bytes;
    s.used = bytes;
    live_.fetch_add(1, std::memory_order_relaxed);
    return s.base;
  }
  // Each segment holds a descriptor: leave three quarters of the limit to
  // the rest of the process (sockets, pipes, files).
  struct rlimit files {};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
      segments_.size() >= files.rlim_cur / 4) {
    if (free_by_size_.empty()) return nullptr;
    ReleaseFree(std::prev(free_by_size_.end()));  // the largest free one makes room
  }
  const int fd = ::memfd_create("neuron-shared-buffer", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  // Allocate the pages now: a full tmpfs is a fallback here, not a SIGBUS.
  if (::posix_fallocate(fd, 0, static_cast<off_t>(size)) != 0 || ::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  Segment s{static_cast<char*>(base), size, fd, static_cast<std::uint64_t>(st.st_ino), bytes};
  try {
    segments_.emplace(s.base, s);
  } catch (...) {
    ::munmap(base, size);
    ::close(fd);
    return nullptr;
  }
  bytes_mapped_ += size;
  live_.fetch_add(1, std::memory_order_relaxed);
  return base;
}

void SharedBufferPool::Release(std::map<const char*, Segment>::iterator it) {
  ::munmap(it->second.base, it->second.bytes);
  ::close(it->second.fd);
  bytes_mapped_ -= it->second.bytes;
  segments_.erase(it);
}

void SharedBufferPool::ReleaseFree(std::multimap<std::size_t, const char*>::iterator it) {
  auto segment = segments_.find(it->second);
  free_bytes_ -= segment->second.bytes;
  free_by_size_.erase(it);
  Release(segment);
}

void SharedBufferPool::Free(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.find(static_cast<const char*>(p));
  NEURON_CHECK(it != segments_.end() && it->second.used > 0,
               "SharedBufferPool::Free of ", p, ", which it did not allocate");
  it->second.used = 0;
  live_.fetch_sub(1, std::memory_order_relaxed);
  if (disabled_) return;  // a forked child's inherited segment: never reused
  if (it->second.forked) {
    Release(it);
    return;
  }
  // Keep the segment just freed, the likeliest to be asked for again: make
  // room by releasing the largest other free ones.
  while (free_bytes_ + it->second.bytes > max_free_bytes_ && !free_by_size_.empty()) {
    ReleaseFree(std::prev(free_by_size_.end()));
  }
  if (free_bytes_ + it->second.bytes > max_free_bytes_) {
    Release(it);
    return;
  }
  free_bytes_ += it->second.bytes;
  free_by_size_.emplace(it->second.bytes, it->first);
}

std::optional<SharedRegion> SharedBufferPool::Find(const void* p, std::size_t bytes) const {
  if (live_.load(std::memory_order_relaxed) == 0) return std::nullopt;
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  if (disabled_) return std::nullopt;
  auto it = segments_.upper_bound(c);
  if (it == segments_.begin()) return std::nullopt;
  const Segment& s = std::prev(it)->second;
  if (s.used == 0 || c + bytes > s.base + s.used) return std::nullopt;
  SharedRegion r;
  r.pid = static_cast<std::int32_t>(::getpid());
  r.fd = s.fd;
  r.inode = s.inode;
  r.segment_bytes = s.bytes;
  r.offset = static_cast<std::uint64_t>(c - s.base);
  r.owner_base = reinterpret_cast<std::uintptr_t>(s.base);
  return r;
}

bool SharedBufferPool::Holds(const void* p) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.find(static_cast<const char*>(p));
  return it != segments_.end() && it->second.used > 0;
}

bool SharedBufferPool::Owns(std::int32_t fd, std::uint64_t inode, std::uint64_t base) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.find(reinterpret_cast<const char*>(static_cast<std::uintptr_t>(base)));
  return it != segments_.end() && it->second.fd == fd && it->second.inode == inode &&
         it->second.used > 0;
}

std::size_t SharedBufferPool::segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return segments_.size();
}

std::size_t SharedBufferPool::bytes_mapped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_mapped_;
}

PeerBufferMap::~PeerBufferMap() {
  for (const Mapping& m : mappings_) ::munmap(m.base, m.bytes);
}

std::vector<PeerBufferMap::Mapping>::iterator PeerBufferMap::Unmap(
    std::vector<Mapping>::iterator it) {
  ::munmap(it->base, it->bytes);
  return mappings_.erase(it);
}

std::size_t PeerBufferMap::bytes_mapped() const {
  std::size_t bytes = 0;
  for (const Mapping& m : mappings_) bytes += m.bytes;
  return bytes;
}

namespace {

std::string OwnerPath(std::int32_t pid, std::int32_t fd) {
  return "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
}

}  // namespace

void PeerBufferMap::SweepIfDue() {
  if (bytes_mapped() <= sweep_at_bytes_) return;
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    struct stat st {};
    const bool held = ::stat(OwnerPath(it->pid, it->fd).c_str(), &st) == 0 &&
                      static_cast<std::uint64_t>(st.st_ino) == it->inode;
    it = held ? it + 1 : Unmap(it);
  }
  sweep_at_bytes_ = std::max(min_sweep_bytes_, 2 * bytes_mapped());
}

char* PeerBufferMap::Map(const SharedRegion& region) {
  // A peer's segment mapped before: the common case, with no system call
  // and no lock. (Only other processes' segments are ever mapped here.)
  for (auto it = mappings_.begin(); it != mappings_.end(); ++it) {
    if (it->pid != region.pid || it->fd != region.fd) continue;
    if (it->inode == region.inode) return it->base + region.offset;
    Unmap(it);  // the descriptor holds another segment now
    break;
  }
  // Our own segment (ranks as threads of one process): its address here.
  // The pool's word, not the pid's (pids repeat across pid namespaces).
  if (region.pid == static_cast<std::int32_t>(::getpid()) &&
      SharedBufferPool::Instance().Owns(region.fd, region.inode, region.owner_base)) {
    return reinterpret_cast<char*>(region.owner_base) + region.offset;
  }
  const std::string path = OwnerPath(region.pid, region.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(StrCat("cannot open process ", region.pid, "'s shared buffer ", path, ": ",
                         std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != region.inode ||
      static_cast<std::uint64_t>(st.st_size) < region.segment_bytes) {
    ::close(fd);
    throw IoError(StrCat(path, " is no longer process ", region.pid,
                         "'s shared buffer (inode ", region.inode, ")"));
  }
  void* base = ::mmap(nullptr, region.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    throw IoError(StrCat("cannot map process ", region.pid, "'s shared buffer ", path, ": ",
                         std::strerror(errno)));
  }
  mappings_.push_back({region.pid, region.fd, region.inode, static_cast<char*>(base),
                       region.segment_bytes});
  return static_cast<char*>(base) + region.offset;
}

}  // namespace neuron::collectives::transport
