// TCP transport: one connection per pair of ranks, for ranks on different
// hosts (and, for tests and simulated nodes, on one host).
//
// Setup is collective through the store: every rank listens on an ephemeral
// port of its address and publishes it; the higher rank of each pair
// connects to the lower one and presents the group's random token (drawn by
// rank 0 and shared through the authenticated store), so a stranger cannot
// join a stream. Sockets are non-blocking; Wait() makes progress and blocks
// in poll() when nothing can move. A peer that closes its connection is an
// IoError naming it, or a RemoteError with the reason when it aborted.
//
// Usage:
//   TcpTransport t(store, rank, size, {.address = "10.0.0.5"});
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "neuron/collectives/store/store.h"
#include "neuron/collectives/transport/transport.h"

namespace neuron::collectives::transport {

class RequestTable;

struct TcpOptions {
  // The address to listen on and publish; empty: 127.0.0.1 when
  // `loopback`, else this host's address on the route to the job's store
  // (NEURON_STORE_ENDPOINT, set by neuronrun), else the first address this
  // host's name resolves to.
  std::string address;
  bool loopback = true;
  std::chrono::milliseconds setup_timeout = std::chrono::minutes(5);
  // The job's secret, for a store that is not authenticated: the group's
  // connection token is derived from it and never stored (GroupToken).
  // Empty: a random token, kept in the store.
  std::string secret;
};

class TcpTransport : public Transport {
 public:
  // `store` must outlive the transport (abort reasons are read from it).
  TcpTransport(Store& store, int rank, int size, TcpOptions options = {});
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  RequestId Isend(int peer, const void* data, std::size_t bytes) override;
  RequestId Irecv(int peer, void* data, std::size_t bytes) override;
  void Wait(const std::vector<RequestId>& ids, Deadline deadline,
            const Label& what) override;
  bool TryWait(const std::vector<RequestId>& ids, Deadline deadline,
               const Label& what) override;
  std::size_t WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                      const Label& what) override;
  void Abort(const std::string& reason) override;

 private:
  static constexpr char kTokenLabel[] = "neuron-tcp-transport-token";
  // The token every member's hello carries (TcpOptions::secret).
  std::string GroupToken();
  void Connect(const std::string& token);
  // Makes progress, blocking in poll(), until done() (errors as Wait).
  template <typename Done>
  void WaitUntil(Done done, const std::vector<RequestId>& ids, Deadline deadline,
                 const Label& what, bool* expired = nullptr);
  bool Progress(const Label& what);
  bool ProgressSend(int peer, const Label& what);
  bool ProgressRecv(int peer, const Label& what);
  [[noreturn]] void PeerLost(int peer, const Label& what, const std::string& how);

  Store& store_;
  int rank_;
  int size_;
  TcpOptions options_;
  int listener_ = -1;
  std::vector<int> sockets_;  // by peer; -1 for self
  std::unique_ptr<RequestTable> requests_;
  // Bytes sent to / received from self (rank == peer) go through here.
  std::deque<char> loopback_;
};

}  // namespace neuron::collectives::transport
