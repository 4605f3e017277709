#include "neuron/collectives/transport/shared_buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
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
  static SharedBufferPool* pool = new SharedBufferPool();  // never destroyed: torch frees late
  return *pool;
}

void* SharedBufferPool::Allocate(std::size_t bytes) {
  NEURON_CHECK(bytes > 0, "shared buffer of 0 bytes");
  const std::size_t size = SizeClass(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = free_by_size_.find(size); it != free_by_size_.end()) {
    Segment& s = segments_.at(it->second);
    free_by_size_.erase(it);
    s.used = bytes;
    return s.base;
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
  segments_.emplace(s.base, s);
  bytes_mapped_ += size;
  return base;
}

void SharedBufferPool::Free(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.find(static_cast<const char*>(p));
  NEURON_CHECK(it != segments_.end() && it->second.used > 0,
               "SharedBufferPool::Free of ", p, ", which it did not allocate");
  it->second.used = 0;
  free_by_size_.emplace(it->second.bytes, it->first);
}

std::optional<SharedRegion> SharedBufferPool::Find(const void* p, std::size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mutex_);
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

char* PeerBufferMap::Map(const SharedRegion& region) {
  if (region.pid == static_cast<std::int32_t>(::getpid())) {
    return reinterpret_cast<char*>(region.owner_base) + region.offset;
  }
  for (const Mapping& m : mappings_) {
    if (m.pid == region.pid && m.fd == region.fd && m.inode == region.inode) {
      return m.base + region.offset;
    }
  }
  const std::string path =
      "/proc/" + std::to_string(region.pid) + "/fd/" + std::to_string(region.fd);
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
