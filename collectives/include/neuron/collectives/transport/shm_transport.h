// Shared-memory transport for ranks on one host.
//
// Every rank owns one POSIX shared-memory segment holding its inbound
// rings (one single-producer single-consumer ring per peer) and a doorbell.
// A sender copies into the ring in the receiver's segment; the receiver
// copies out. After writing (or freeing space) a rank rings the other's
// doorbell, a futex word: waiting spins briefly, then sleeps on its own
// doorbell, so 16 ranks on 2 cores do not starve each other. Segments are
// unlinked as soon as every rank has mapped them, so nothing is left in
// /dev/shm even when a rank is killed. A dead peer is noticed by its pid.
//
// Usage (all ranks of a group, on one host):
//   ShmTransport t(store, rank, size, {.ring_bytes = 4 << 20});
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/store/store.h"
#include "neuron/collectives/transport/shared_windows.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives::transport {

class RequestTable;

struct ShmOptions {
  std::size_t ring_bytes = 4u << 20;  // per directed pair; a power of two
  std::size_t window_bytes = 16u << 20;  // each rank's shared staging window
  std::chrono::milliseconds setup_timeout = std::chrono::minutes(5);
  // How long a waiting rank polls before it sleeps on its doorbell: long
  // enough to catch a peer running on another core, short when ranks
  // outnumber cores (then every poll also yields the core).
  std::chrono::microseconds spin_time{50};
  // How often a sleeping rank wakes on its own to check its deadline and
  // its peers' pids. Tests raise it so that a lost wake-up is a timeout.
  std::chrono::milliseconds check_interval{100};
  // The job rank of each member, for messages about a member (a dead peer
  // is "rank 3 (member 1 of this group, pid N)"); empty: member i is rank i.
  std::vector<int> global_ranks{};
};

class ShmTransport final : public Transport, public SharedWindows {
 public:
  // Collective over the ranks: creates this rank's segment, publishes its
  // name in `store`, maps every peer's, then unlinks its own once all have
  // mapped. Throws IoError naming the segment on failure.
  ShmTransport(Store& store, int rank, int size, ShmOptions options = {});
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "shm"; }

  RequestId Isend(int peer, const void* data, std::size_t bytes) override;
  RequestId Irecv(int peer, void* data, std::size_t bytes) override;
  void Wait(const std::vector<RequestId>& ids, Deadline deadline,
            const Label& what) override;
  bool TryWait(const std::vector<RequestId>& ids, Deadline deadline,
               const Label& what) override;
  std::size_t WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                      const Label& what) override;
  void Abort(const std::string& reason) override;

  // The shared windows (shared_windows.h): every rank's staging window,
  // and phase counters in its segment.
  SharedWindows* windows() override { return this; }
  char* Window(int rank) const override { return windows_[static_cast<std::size_t>(rank)]; }
  std::size_t window_bytes() const override { return options_.window_bytes; }
  void PublishPhase(int index, std::uint64_t value) override;
  void WaitPhase(int index, std::uint64_t value, Deadline deadline,
                 const Label& what) override;
  void SyncPhase(int index, std::uint64_t value, Deadline deadline,
                 const Label& what) override;
  void SyncWindowWord(std::size_t offset, std::uint64_t value, Deadline deadline,
                      const Label& what) override;

 private:
  struct Segment;

  // Blocks until `ready()` (which may make progress); spins briefly, then
  // sleeps on this rank's doorbell. `pending()` describes what is missing
  // and `peers()` who we wait for, for timeouts and dead-peer checks. At
  // the deadline: sets *expired and returns when `expired` is given, else
  // throws TimeoutError.
  template <typename Ready, typename Pending, typename Peers>
  void Block(Ready ready, Pending pending, Peers peers, Deadline deadline,
             const Label& what, bool* expired = nullptr);
  // Moves as many bytes as possible for the head request of every queue;
  // returns true when anything moved.
  // Makes progress, blocking on the doorbell, until done() (errors as Wait).
  template <typename Done>
  void WaitUntil(Done done, const std::vector<RequestId>& ids, Deadline deadline,
                 const Label& what, bool* expired = nullptr);
  bool Progress();
  bool ProgressSend(int peer);
  bool ProgressRecv(int peer);
  void RingDoorbell(int peer);
  void WakeSleepers();
  template <typename Flag>
  void WaitAll(Flag flag, std::uint64_t value, Deadline deadline, const Label& what,
               bool self_done = false);
  template <typename Flag>
  void Sync(Flag flag, std::uint64_t value, Deadline deadline, const Label& what);
  void CheckAlive(int peer, const Label& what, const std::string& pending);
  // Waits for `peer` to have mapped every segment (the setup's last step),
  // failing fast with an IoError naming it when its process dies.
  void WaitMapped(Store& store, int peer, std::chrono::steady_clock::time_point give_up);
  // On a failed setup (the group cannot finish it without this rank):
  // unlinks every peer's segment name, so those of peers killed in the
  // setup do not stay in /dev/shm (only a finished setup unlinks them; a
  // live peer fails its setup too and keeps what it mapped).
  void UnlinkPeers(const std::string& uid) const;
  // "rank G (member P of this group, pid N)" for member `peer`, or "rank P
  // (pid N)" when the member is the job rank of the same number; pid 0:
  // no pid.
  std::string Member(int peer, pid_t pid) const;

  int rank_;
  int size_;
  ShmOptions options_;
  bool oversubscribed_;  // more ranks than cores: yield while polling
  std::vector<Segment*> segments_;  // mapped segment of every rank (own included)
  std::vector<char*> windows_;      // every rank's window in its segment
  std::size_t segment_bytes_ = 0;
  std::unique_ptr<RequestTable> requests_;
};

}  // namespace neuron::collectives::transport
