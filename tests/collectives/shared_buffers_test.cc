// SharedBufferPool and PeerBufferMap: registered memory that another
// process maps through /proc/<pid>/fd, reused by size class, found by any
// address inside a live allocation.
#include "neuron/collectives/transport/shared_buffers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "neuron/runtime/error.h"

namespace neuron::collectives::transport {
namespace {

TEST(SharedBufferPool, FindsAddressesInsideLiveAllocationsOnly) {
  SharedBufferPool pool;
  char* p = static_cast<char*>(pool.Allocate(100000));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  const auto whole = pool.Find(p, 100000);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(whole->pid, ::getpid());
  EXPECT_GE(whole->segment_bytes, 100000u);
  const auto inside = pool.Find(p + 4000, 96000);
  ASSERT_TRUE(inside.has_value());
  EXPECT_EQ(inside->offset, 4000u);
  EXPECT_EQ(inside->fd, whole->fd);
  EXPECT_FALSE(pool.Find(p + 4000, 96001).has_value());  // runs past the allocation
  int on_stack = 0;
  EXPECT_FALSE(pool.Find(&on_stack, sizeof(on_stack)).has_value());
  pool.Free(p);
  EXPECT_FALSE(pool.Find(p, 1).has_value());  // freed
}

TEST(SharedBufferPool, ReusesAFreedSegmentOfTheSameSizeClass) {
  SharedBufferPool pool;
  void* a = pool.Allocate(3 << 20);
  ASSERT_NE(a, nullptr);
  const std::size_t segments = pool.segments();
  pool.Free(a);
  void* b = pool.Allocate((3 << 20) - 1000);  // same class
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.segments(), segments);
  void* c = pool.Allocate(5 << 20);  // another class: a new segment
  EXPECT_NE(c, a);
  EXPECT_EQ(pool.segments(), segments + 1);
  pool.Free(b);
  pool.Free(c);
}

TEST(SharedBufferPool, FreeingForeignMemoryIsInvalidUsage) {
  SharedBufferPool pool;
  int x = 0;
  EXPECT_THROW(pool.Free(&x), InvalidUsage);
  void* p = pool.Allocate(4096);
  pool.Free(p);
  EXPECT_THROW(pool.Free(p), InvalidUsage);  // twice
}

TEST(SharedBufferPool, KeepsAtMostItsCapOfFreeSegments) {
  constexpr std::size_t kBytes = 64 << 10;
  SharedBufferPool pool(2 * kBytes);  // two free segments at most
  void* a = pool.Allocate(kBytes);
  void* b = pool.Allocate(kBytes);
  void* c = pool.Allocate(kBytes);
  ASSERT_TRUE(a && b && c);
  pool.Free(a);
  pool.Free(b);  // at the cap: kept
  EXPECT_EQ(pool.segments(), 3u);
  pool.Free(c);  // beyond it: closed and unmapped
  EXPECT_EQ(pool.segments(), 2u);
  EXPECT_EQ(pool.bytes_mapped(), 2 * kBytes);
}

// At its segment limit (a quarter of the open-file limit) the pool makes
// room by releasing a free segment, and returns null when none is free.
// In a child, whose open-file limit can be lowered without harm.
TEST(SharedBufferPool, AtItsSegmentLimitReleasesAFreeSegmentOrFallsBack) {
  const pid_t child = ::fork();
  if (child == 0) {
    // As a fresh process: the descriptors this one holds (earlier tests'
    // segments and transports) do not count against the child's limit.
    ::close_range(3, ~0u, 0);
    const rlimit files{40, 40};  // 10 segments at most
    if (::setrlimit(RLIMIT_NOFILE, &files) != 0) ::_exit(2);
    try {  // the child must never return into the test runner
      SharedBufferPool pool;
      std::vector<void*> held;
      for (int i = 0; i < 10; ++i) held.push_back(pool.Allocate(4096));
      if (held.back() == nullptr) ::_exit(5);
      if (pool.Allocate(8192) != nullptr) ::_exit(3);  // none free: fall back
      pool.Free(held.back());
      void* other = pool.Allocate(8192);  // another size class: the free one makes room
      ::_exit(other != nullptr && pool.segments() == 10 ? 0 : 4);
    } catch (...) {
      ::_exit(6);
    }
  }
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// A released segment's descriptor may come back holding another segment:
// a peer's map tells them apart by inode and maps the new one.
TEST(PeerBufferMap, ARecycledDescriptorIsMappedAnew) {
  constexpr std::size_t kBytes = 64 << 10;
  SharedBufferPool pool(0);  // keeps no free segment
  PeerBufferMap map;  // not the process's pool: maps through /proc/self/fd
  auto* first = static_cast<char*>(pool.Allocate(kBytes));
  first[0] = 'a';
  const SharedRegion one = *pool.Find(first, kBytes);
  EXPECT_EQ(map.Map(one)[0], 'a');
  pool.Free(first);  // released: the descriptor is closed
  auto* second = static_cast<char*>(pool.Allocate(kBytes));
  second[0] = 'b';
  const SharedRegion two = *pool.Find(second, kBytes);
  ASSERT_EQ(two.fd, one.fd);  // the lowest free descriptor, reused
  ASSERT_NE(two.inode, one.inode);
  EXPECT_EQ(map.Map(two)[0], 'b');
  pool.Free(second);
}

// Segments their owner released are unmapped by the next sweep, one due
// once the mapped bytes pass the threshold; segments still held stay
// mapped, and Map itself never sweeps (an operation's buffers stay put).
TEST(PeerBufferMap, ASweepUnmapsReleasedSegmentsOnly) {
  constexpr std::size_t kBytes = 64 << 10;
  SharedBufferPool pool(0);      // keeps no free segment: Free releases
  PeerBufferMap map(3 * kBytes);  // sweeps once more than 3 segments are mapped
  std::vector<char*> buffers;
  for (int i = 0; i < 3; ++i) {
    buffers.push_back(static_cast<char*>(pool.Allocate(kBytes)));
    buffers.back()[0] = static_cast<char>('a' + i);
    ASSERT_EQ(map.Map(*pool.Find(buffers.back(), kBytes))[0], 'a' + i);
  }
  pool.Free(buffers[0]);
  pool.Free(buffers[1]);
  map.SweepIfDue();  // 3 segments: not due
  EXPECT_EQ(map.mappings(), 3u);
  // Other files take the released descriptors' numbers, so the next
  // segment gets a new one (a recycled number is unmapped on sight).
  const int other1 = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int other2 = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto* next = static_cast<char*>(pool.Allocate(kBytes));
  next[0] = 'd';
  EXPECT_EQ(map.Map(*pool.Find(next, kBytes))[0], 'd');
  EXPECT_EQ(map.mappings(), 4u);  // due now, but not inside Map
  map.SweepIfDue();
  EXPECT_EQ(map.mappings(), 2u);
  EXPECT_EQ(map.bytes_mapped(), 2 * kBytes);
  EXPECT_EQ(map.Map(*pool.Find(buffers[2], kBytes))[0], 'c');  // still mapped
  EXPECT_EQ(map.mappings(), 2u);
  ::close(other1);
  ::close(other2);
  pool.Free(buffers[2]);
  pool.Free(next);
}

// The process's pool in a forked child: disabled, so the child never hands
// out a segment the parent also uses; its parent's pool goes on as before.
TEST(SharedBufferPool, AForkedChildGetsADisabledPool) {
  auto& pool = SharedBufferPool::Instance();
  void* freed = pool.Allocate(3 << 20);
  void* live = pool.Allocate(3 << 20);
  pool.Free(freed);
  const pid_t child = ::fork();
  if (child == 0) {
    const bool ok = pool.Allocate(3 << 20) == nullptr && !pool.Find(live, 1).has_value();
    pool.Free(live);  // allowed, and not reused
    ::_exit(ok && pool.Allocate(4096) == nullptr ? 0 : 1);
  }
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::size_t segments = pool.segments();
  void* again = pool.Allocate(3 << 20);
  EXPECT_NE(again, nullptr);
  EXPECT_EQ(pool.segments(), segments);  // the parent reuses one free at the fork
  EXPECT_TRUE(pool.Find(live, 1).has_value());
  pool.Free(live);  // live at the fork (a child may hold it): released
  EXPECT_EQ(pool.segments(), segments - 1);
  pool.Free(again);
}

// A child process allocates and fills a buffer and shows its region; this
// process maps it, checks the child's bytes, writes its own, and the child
// checks those: both see one memory.
TEST(PeerBufferMap, AnotherProcessMapsTheSameMemory) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  constexpr std::size_t kBytes = 1 << 20;
  const pid_t child = ::fork();
  if (child == 0) {
    SharedBufferPool pool;  // the process's own is disabled in a forked child
    auto* p = static_cast<unsigned char*>(pool.Allocate(kBytes));
    for (std::size_t i = 0; i < kBytes; ++i) p[i] = static_cast<unsigned char>(i % 251);
    const SharedRegion region = *pool.Find(p + 64, kBytes - 64);
    if (::write(to_parent[1], &region, sizeof(region)) != sizeof(region)) ::_exit(2);
    char go = 0;
    if (::read(to_child[0], &go, 1) != 1) ::_exit(3);
    for (std::size_t i = 64; i < kBytes; ++i) {
      if (p[i] != static_cast<unsigned char>(255 - i % 251)) ::_exit(4);
    }
    ::_exit(0);
  }
  SharedRegion region;
  ASSERT_EQ(::read(to_parent[0], &region, sizeof(region)), static_cast<ssize_t>(sizeof(region)));
  EXPECT_EQ(region.pid, child);
  {
    PeerBufferMap map;
    auto* q = reinterpret_cast<unsigned char*>(map.Map(region));
    EXPECT_EQ(reinterpret_cast<unsigned char*>(map.Map(region)), q);  // mapped once
    bool same = true;
    for (std::size_t i = 64; i < kBytes; ++i) same = same && q[i - 64] == i % 251;
    EXPECT_TRUE(same) << "the child's bytes";
    for (std::size_t i = 64; i < kBytes; ++i) q[i - 64] = static_cast<unsigned char>(255 - i % 251);
  }
  ASSERT_EQ(::write(to_child[1], "g", 1), 1);
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
}

TEST(PeerBufferMap, AGoneProcessIsAnIoErrorNamingIt) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  SharedRegion region;
  region.pid = child;
  region.fd = 3;
  region.segment_bytes = 4096;
  PeerBufferMap map;
  try {
    map.Map(region);
    FAIL() << "mapped a dead process's buffer";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/" + std::to_string(child) + "/fd/3"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace neuron::collectives::transport
