#include "neuron/collectives/transport/shm_transport.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "futex.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/error.h"
#include "request_table.h"

namespace neuron::collectives::transport {

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kReasonBytes = 512;
// Polling without yielding first, for a peer that runs on another core.
constexpr std::chrono::microseconds kPurePoll(5);
// Polls before the first clock read, when every rank has a core: ~100 ns
// (the time a flag takes to cross between cores on this kind of machine).
constexpr int kClocklessPolls = 64;
// How often a rank waiting for its peers to finish the setup checks that
// they are alive.
constexpr std::chrono::milliseconds kSetupSlice(100);

std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

struct alignas(64) RingHeader {
  std::atomic<std::uint64_t> head;  // bytes ever written (by the producer)
  char pad[64 - sizeof(std::atomic<std::uint64_t>)];
  std::atomic<std::uint64_t> tail;  // bytes ever read (by the consumer)
  char pad2[64 - sizeof(std::atomic<std::uint64_t>)];
};

// False once `pid` has exited, zombies included (a dead rank stays a zombie
// until its parent reaps it).
bool ProcessAlive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the state follows ") "
  if (paren == nullptr || paren + 2 >= buf + n) return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

std::string SegmentName(const std::string& uid, int rank) {
  return "/neuron-" + uid + "-" + std::to_string(rank);
}

}  // namespace

// The start of every rank's segment; rings follow at RingsOffset().
struct ShmTransport::Segment {
  std::atomic<std::uint32_t> doorbell;  // bumped by anyone who may unblock us
  std::atomic<std::uint32_t> sleepers;  // > 0 while the owner sleeps on it
  std::atomic<std::uint32_t> aborted;   // 0 no, 1 being written, 2 yes
  std::int32_t owner_pid;
  char reason[kReasonBytes];
  std::atomic<std::uint64_t> phase[kPhases];  // PublishPhase / WaitPhase counters

  static std::size_t RingsOffset() { return RoundUp(sizeof(Segment), kPage); }
  RingHeader* ring(int peer) {
    return reinterpret_cast<RingHeader*>(reinterpret_cast<char*>(this) + RingsOffset()) + peer;
  }
  char* data(int peer, int size, std::size_t ring_bytes) {
    const std::size_t start = RoundUp(RingsOffset() + size * sizeof(RingHeader), kPage);
    return reinterpret_cast<char*>(this) + start + peer * ring_bytes;
  }
  static std::size_t RingsBytes(int size, std::size_t ring_bytes) {
    return RoundUp(RingsOffset() + size * sizeof(RingHeader), kPage) + size * ring_bytes;
  }
  char* window(int size, std::size_t ring_bytes) {
    return reinterpret_cast<char*>(this) + RingsBytes(size, ring_bytes);
  }
  static std::size_t Bytes(int size, std::size_t ring_bytes, std::size_t window_bytes) {
    return RingsBytes(size, ring_bytes) + RoundUp(window_bytes, kPage);
  }
};

ShmTransport::ShmTransport(Store& store, int rank, int size, ShmOptions options)
    : rank_(rank), size_(size), options_(options),
      oversubscribed_(static_cast<unsigned>(size) > std::max(1u, std::thread::hardware_concurrency())),
      segments_(size, nullptr), requests_(std::make_unique<RequestTable>(size)) {
  NEURON_CHECK(rank >= 0 && rank < size, "shm transport: rank ", rank, " outside 0..",
               size - 1);
  NEURON_CHECK(options_.global_ranks.empty() ||
                   options_.global_ranks.size() == static_cast<std::size_t>(size),
               "shm transport: global_ranks has ", options_.global_ranks.size(),
               " entries for ", size, " members");
  NEURON_CHECK(options_.window_bytes >= kPage, "shm window must be >= 4096 bytes, got ",
               options_.window_bytes);
  NEURON_CHECK(options_.ring_bytes >= kPage &&
                   (options_.ring_bytes & (options_.ring_bytes - 1)) == 0,
               "shm ring size must be a power of two >= 4096, got ", options_.ring_bytes);
  segment_bytes_ = Segment::Bytes(size, options_.ring_bytes, options_.window_bytes);
  if (rank == 0) store.Set("shm/uid", auth::GenerateSecret().substr(0, 16));
  const std::string uid = store.Get("shm/uid", options_.setup_timeout);
  const std::string own_name = SegmentName(uid, rank);

  const int fd = ::shm_open(own_name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw IoError(StrCat("shm_open ", own_name, ": ", std::strerror(errno)));
  // Allocate now: a full /dev/shm must be an error here, not a SIGBUS on
  // first touch of a sparse page later.
  const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(segment_bytes_));
  if (e != 0) {
    ::close(fd);
    ::shm_unlink(own_name.c_str());
    throw IoError(StrCat("cannot allocate ", segment_bytes_, " bytes of shared memory (",
                         own_name, ") for rank ", rank, ": ", std::strerror(e),
                         e == ENOSPC ? "; /dev/shm is too small" : ""));
  }
  void* own = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (own == MAP_FAILED) {
    ::shm_unlink(own_name.c_str());
    throw IoError(StrCat("cannot map shared memory ", own_name, ": ", std::strerror(errno)));
  }
  auto* seg = new (own) Segment();
  seg->owner_pid = static_cast<std::int32_t>(::getpid());
  for (int p = 0; p < size; ++p) new (seg->ring(p)) RingHeader();
  segments_[rank] = seg;
  store.Set("shm/ready/" + std::to_string(rank), "");

  try {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      store.Wait({"shm/ready/" + std::to_string(p)}, options_.setup_timeout);
      const std::string name = SegmentName(uid, p);
      const int pfd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      if (pfd < 0) throw IoError(StrCat("shm_open of rank ", p, "'s ", name, ": ", std::strerror(errno)));
      struct stat st {};
      if (::fstat(pfd, &st) != 0 || static_cast<std::size_t>(st.st_size) != segment_bytes_) {
        ::close(pfd);
        throw InvalidUsage(StrCat("rank ", p, "'s shared memory has ", st.st_size,
                                  " bytes but rank ", rank, " expects ", segment_bytes_,
                                  ": the ranks were created with different ring or window sizes"));
      }
      void* m = ::mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
      ::close(pfd);
      if (m == MAP_FAILED) throw IoError(StrCat("cannot map rank ", p, "'s ", name));
      segments_[p] = static_cast<Segment*>(m);
    }
    store.Set("shm/mapped/" + std::to_string(rank), "");
    const auto give_up = std::chrono::steady_clock::now() + options_.setup_timeout;
    for (int p = 0; p < size; ++p) WaitMapped(store, p, give_up);
  } catch (...) {
    ::shm_unlink(own_name.c_str());
    UnlinkPeers(uid);
    for (auto* s : segments_) if (s) ::munmap(s, segment_bytes_);
    throw;
  }
  // Everyone has it mapped: the name can go, the memory stays until unmapped.
  ::shm_unlink(own_name.c_str());
  for (Segment* s : segments_) windows_.push_back(s->window(size, options_.ring_bytes));
}

ShmTransport::~ShmTransport() {
  for (auto* s : segments_) {
    if (s != nullptr) ::munmap(s, segment_bytes_);
  }
}

RequestId ShmTransport::Isend(int peer, const void* data, std::size_t bytes) {
  return requests_->Post(peer, true, data, bytes);
}

RequestId ShmTransport::Irecv(int peer, void* data, std::size_t bytes) {
  return requests_->Post(peer, false, data, bytes);
}

void ShmTransport::RingDoorbell(int peer) {
  Segment* s = segments_[peer];
  s->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (s->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&s->doorbell);
}

bool ShmTransport::ProgressSend(int peer) {
  auto& queue = requests_->sends(peer);
  bool moved = false;
  while (!queue.empty()) {
    RequestTable::Request& r = requests_->at(queue.front());
    // My stream to `peer` is the ring for me in the peer's segment.
    Segment* dst = segments_[peer];
    RingHeader* ring = dst->ring(rank_);
    char* data = dst->data(rank_, size_, options_.ring_bytes);
    const std::uint64_t head = ring->head.load(std::memory_order_relaxed);
    const std::uint64_t tail = ring->tail.load(std::memory_order_acquire);
    std::size_t n = std::min<std::size_t>(options_.ring_bytes - (head - tail), r.bytes - r.done);
    if (n == 0 && r.bytes != r.done) break;
    const std::size_t at = head & (options_.ring_bytes - 1);
    const std::size_t first = std::min(n, options_.ring_bytes - at);
    std::memcpy(data + at, r.data + r.done, first);
    std::memcpy(data, r.data + r.done + first, n - first);
    ring->head.store(head + n, std::memory_order_release);
    r.done += n;
    moved = moved || n > 0;
    if (r.done != r.bytes) break;
    queue.pop_front();
  }
  if (moved) RingDoorbell(peer);
  return moved;
}

bool ShmTransport::ProgressRecv(int peer) {
  auto& queue = requests_->recvs(peer);
  bool moved = false;
  Segment* own = segments_[rank_];
  RingHeader* ring = own->ring(peer);
  const char* data = own->data(peer, size_, options_.ring_bytes);
  while (!queue.empty()) {
    RequestTable::Request& r = requests_->at(queue.front());
    const std::uint64_t tail = ring->tail.load(std::memory_order_relaxed);
    const std::uint64_t head = ring->head.load(std::memory_order_acquire);
    const std::size_t n = std::min<std::size_t>(head - tail, r.bytes - r.done);
    if (n == 0 && r.bytes != r.done) break;
    const std::size_t at = tail & (options_.ring_bytes - 1);
    const std::size_t first = std::min(n, options_.ring_bytes - at);
    std::memcpy(r.data + r.done, data + at, first);
    std::memcpy(r.data + r.done + first, data, n - first);
    ring->tail.store(tail + n, std::memory_order_release);
    r.done += n;
    moved = moved || n > 0;
    if (r.done != r.bytes) break;
    queue.pop_front();
  }
  if (moved) RingDoorbell(peer);  // the sender may be waiting for space
  return moved;
}

bool ShmTransport::Progress() {
  bool moved = false;
  for (int p = 0; p < size_; ++p) {
    if (!requests_->sends(p).empty()) moved |= ProgressSend(p);
    if (!requests_->recvs(p).empty()) moved |= ProgressRecv(p);
  }
  return moved;
}

void ShmTransport::WaitMapped(Store& store, int peer,
                              std::chrono::steady_clock::time_point give_up) {
  const std::string key = "shm/mapped/" + std::to_string(peer);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        give_up - std::chrono::steady_clock::now());
    try {
      store.Wait({key}, std::clamp(left, std::chrono::milliseconds(1), kSetupSlice));
      return;
    } catch (const TimeoutError&) {
      if (left <= kSetupSlice) {
        throw TimeoutError(StrCat("shm transport setup: rank ", rank_, " waited ",
                                  options_.setup_timeout.count(), " ms for rank ", peer,
                                  " to map every segment (", key, ")"));
      }
    }
    const pid_t pid = segments_[peer]->owner_pid;
    if (!ProcessAlive(pid)) {
      throw IoError(StrCat("shm transport setup: ", Member(peer, pid),
                           " died before it had mapped every segment; ", Member(rank_, 0),
                           " was waiting for it"));
    }
  }
}

void ShmTransport::UnlinkPeers(const std::string& uid) const {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) ::shm_unlink(SegmentName(uid, p).c_str());  // ENOENT: gone already
  }
}

void ShmTransport::CheckAlive(int peer, const Label& what, const std::string& pending) {
  const pid_t pid = segments_[peer]->owner_pid;
  if (!ProcessAlive(pid)) {
    throw IoError(StrCat(what, ": ", Member(peer, pid), " died; ", Member(rank_, 0),
                         " was waiting on ", pending));
  }
}

std::string ShmTransport::Member(int peer, pid_t pid) const {
  const auto& global = options_.global_ranks;
  const int job_rank = global.empty() ? peer : global[static_cast<std::size_t>(peer)];
  std::vector<std::string> notes;
  if (job_rank != peer) notes.push_back(StrCat("member ", peer, " of this group"));
  if (pid != 0) notes.push_back(StrCat("pid ", pid));
  std::string out = StrCat("rank ", job_rank);
  for (std::size_t i = 0; i < notes.size(); ++i) out += (i == 0 ? " (" : ", ") + notes[i];
  return notes.empty() ? out : out + ")";
}

template <typename Ready, typename PendingText, typename Peers>
void ShmTransport::Block(Ready ready, PendingText pending, Peers peers, Deadline deadline,
                         const Label& what, bool* expired) {
  Segment* own = segments_[rank_];
  // Done already (the common case of a small collective whose peers are
  // ahead), or soon (a peer on another core a cache-line transfer away):
  // no clock read at all.
  if (own->aborted.load(std::memory_order_acquire) != 2) {
    bool moved = false;
    const int polls = oversubscribed_ ? 1 : kClocklessPolls;
    for (int i = 0; i < polls; ++i) {
      if (ready(&moved)) return;
    }
  }
  auto spin_start = Clock::now();
  auto spin_until = spin_start + options_.spin_time;
  auto next_check = spin_start + options_.check_interval;
  while (true) {
    if (own->aborted.load(std::memory_order_acquire) == 2) {
      throw RemoteError(StrCat(what, " on rank ", rank_, " aborted: ", own->reason));
    }
    const std::uint32_t bell = own->doorbell.load(std::memory_order_seq_cst);
    bool moved = false;
    if (ready(&moved)) return;
    auto now = Clock::now();
    if (moved) {
      spin_start = now;
      spin_until = now + options_.spin_time;
      continue;
    }
    if (now < spin_until) {
      // The peer we wait for may share this core (always so when ranks
      // outnumber cores; sometimes otherwise, as the scheduler pleases):
      // after a moment of pure polling, yield on every poll.
      if (oversubscribed_ || now - spin_start > kPurePoll) {
        ::sched_yield();
      } else {
        __builtin_ia32_pause();
      }
      continue;
    }
    if (now >= deadline.At(now)) {
      if (expired != nullptr) {
        *expired = true;
        return;
      }
      throw TimeoutError(StrCat(what, " on rank ", rank_, " timed out; still pending: ",
                                pending()));
    }
    if (now >= next_check) {
      for (int peer : peers()) CheckAlive(peer, what, pending());
      next_check = now + options_.check_interval;
    }
    own->sleepers.fetch_add(1, std::memory_order_seq_cst);
    // Publishers of phases ring only sleepers (PublishPhase): look once
    // more now that we count as one, or a publish in between is missed.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool ready_now = false;
    if (own->aborted.load(std::memory_order_acquire) != 2) {
      bool ignored = false;
      ready_now = ready(&ignored);
    }
    if (!ready_now && own->doorbell.load(std::memory_order_seq_cst) == bell) {
      const auto sleep = std::min<Clock::duration>(deadline.At(now) - now, options_.check_interval);
      FutexWait(&own->doorbell, bell, std::chrono::duration_cast<std::chrono::nanoseconds>(sleep));
    }
    own->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    spin_start = Clock::now();
    spin_until = spin_start + options_.spin_time;
  }
}

template <typename Done>
void ShmTransport::WaitUntil(Done done, const std::vector<RequestId>& ids, Deadline deadline,
                             const Label& what, bool* expired) {
  Block(
      [&](bool* moved) {
        if (done()) return true;
        *moved = Progress();
        return done();
      },
      [&] { return requests_->Pending(ids); }, [&] { return requests_->PendingPeers(ids); },
      deadline, what, expired);
}

void ShmTransport::Wait(const std::vector<RequestId>& ids, Deadline deadline,
                        const Label& what) {
  WaitAllOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

bool ShmTransport::TryWait(const std::vector<RequestId>& ids, Deadline deadline,
                           const Label& what) {
  return TryWaitAllOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

std::size_t ShmTransport::WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                                  const Label& what) {
  return WaitAnyOf(*requests_, ids, [&](auto done, bool* expired) {
    WaitUntil(done, ids, deadline, what, expired);
  });
}

// Rings the peers that sleep. After this rank stored a flag, the seq_cst
// fence orders that store before the look at `sleepers`, and a waiter
// counts itself a sleeper before its last look at the flags (Block): one of
// the two sees the other (Dekker). Peers that poll are left undisturbed: no
// doorbell cache line moves between cores per phase.
void ShmTransport::WakeSleepers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && segments_[p]->sleepers.load(std::memory_order_relaxed) > 0) {
      RingDoorbell(p);
    }
  }
}

template <typename Flag>
void ShmTransport::WaitAll(Flag flag, std::uint64_t value, Deadline deadline,
                           const Label& what, bool self_done) {
  // (A rank that just stored its own flag does not load it back: the store
  // may still wait for its cache line, and the load would wait with it.)
  auto late = [&](int p) {
    return !(self_done && p == rank_) && flag(p).load(std::memory_order_acquire) < value;
  };
  auto behind = [&] {  // for messages only
    std::vector<int> out;
    for (int p = 0; p < size_; ++p) {
      if (late(p)) out.push_back(p);
    }
    return out;
  };
  Block(
      [&](bool*) {  // no allocation: this runs on every poll
        for (int p = 0; p < size_; ++p) {
          if (late(p)) return false;
        }
        return true;
      },
      [&] {
        const std::vector<int> late_ranks = behind();
        if (late_ranks.empty()) return std::string("none (the last rank arrived as the wait ended)");
        std::string text = "ranks that have not arrived:";
        for (int p : late_ranks) text += " " + std::to_string(p);
        return text;
      },
      behind, deadline, what);
}

// (Waking the sleepers only after the wait, off the critical path, made no
// difference with a core per rank, and with more ranks than cores kept
// sleepers asleep until the last rank arrived: 2.4x slower at 4 ranks.)
template <typename Flag>
void ShmTransport::Sync(Flag flag, std::uint64_t value, Deadline deadline, const Label& what) {
  flag(rank_).store(value, std::memory_order_release);
  WakeSleepers();
  WaitAll(flag, value, deadline, what, /*self_done=*/true);
}

void ShmTransport::PublishPhase(int index, std::uint64_t value) {
  segments_[rank_]->phase[index].store(value, std::memory_order_release);
  WakeSleepers();
}

void ShmTransport::WaitPhase(int index, std::uint64_t value, Deadline deadline,
                             const Label& what) {
  WaitAll([&](int p) -> std::atomic<std::uint64_t>& { return segments_[p]->phase[index]; },
          value, deadline, what);
}

void ShmTransport::SyncPhase(int index, std::uint64_t value, Deadline deadline,
                             const Label& what) {
  Sync([&](int p) -> std::atomic<std::uint64_t>& { return segments_[p]->phase[index]; }, value,
       deadline, what);
}

void ShmTransport::SyncWindowWord(std::size_t offset, std::uint64_t value, Deadline deadline,
                                  const Label& what) {
  Sync([&](int p) -> std::atomic<std::uint64_t>& {
         return *reinterpret_cast<std::atomic<std::uint64_t>*>(Window(p) + offset);
       },
       value, deadline, what);
}

void ShmTransport::Abort(const std::string& reason) {
  for (int p = 0; p < size_; ++p) {
    Segment* s = segments_[p];
    std::uint32_t expected = 0;
    if (s->aborted.compare_exchange_strong(expected, 1)) {
      std::strncpy(s->reason, reason.c_str(), kReasonBytes - 1);
      s->reason[kReasonBytes - 1] = '\0';
      s->aborted.store(2, std::memory_order_release);
    }
    RingDoorbell(p);
  }
}

}  // namespace neuron::collectives::transport
