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
#include <deque>
#include <memory>
#include <vector>

#include "neuron/collectives/store/store.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives::transport {

struct ShmOptions {
  std::size_t ring_bytes = 4u << 20;  // per directed pair; a power of two
  std::chrono::milliseconds setup_timeout = std::chrono::minutes(5);
  int spin_iterations = 200;          // progress attempts before sleeping
};

class ShmTransport : public Transport {
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
            const std::string& what) override;
  void Abort(const std::string& reason) override;

 private:
  struct Segment;
  struct Request {
    int peer = 0;
    bool is_send = false;
    char* data = nullptr;
    std::size_t bytes = 0;
    std::size_t done = 0;
  };

  // Moves as many bytes as possible for the head request of every queue;
  // returns true when anything moved.
  bool Progress();
  bool ProgressSend(int peer);
  bool ProgressRecv(int peer);
  bool Complete(RequestId id) const;
  void RingDoorbell(int peer);
  void CheckPeers(const std::string& what, const std::vector<RequestId>& ids);
  std::string Pending(const std::vector<RequestId>& ids) const;

  int rank_;
  int size_;
  ShmOptions options_;
  std::vector<Segment*> segments_;  // mapped segment of every rank (own included)
  std::size_t segment_bytes_ = 0;
  std::vector<Request> requests_;   // by id - first_id_
  RequestId first_id_ = 0;
  std::vector<std::deque<RequestId>> send_queue_;
  std::vector<std::deque<RequestId>> recv_queue_;
};

}  // namespace neuron::collectives::transport
