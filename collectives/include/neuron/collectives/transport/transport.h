// A rank's byte streams to its peers: the one interface every algorithm
// uses, whatever carries the bytes (shared memory, TCP).
//
// Each ordered pair of ranks is a stream: sends to a peer arrive in the order
// they were posted, and receives from a peer are filled in the order they
// were posted, so a receive must ask for exactly the bytes the matching send
// gives (the collectives' headers make sure of it). Posting never blocks;
// Wait() makes progress on every posted request and blocks, without spinning
// a core, until the requests it names are complete.
//
// Usage:
//   auto s = transport.Isend(right, out, bytes);
//   auto r = transport.Irecv(left, in, bytes);
//   transport.Wait({s, r}, Deadline::After(std::chrono::minutes(5)), "allreduce #3");
//
// Not thread-safe: one thread (the communicator's) drives a transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace neuron::collectives::transport {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;
  static Deadline After(std::chrono::milliseconds timeout) { return {Clock::now() + timeout}; }
};

using RequestId = std::uint64_t;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm", "tcp", ...
  virtual const char* name() const = 0;

  // `data` must stay valid (and, for receives, untouched) until a Wait that
  // names the request returns.
  virtual RequestId Isend(int peer, const void* data, std::size_t bytes) = 0;
  virtual RequestId Irecv(int peer, void* data, std::size_t bytes) = 0;

  // Blocks until every request in `ids` is complete. `what` names the
  // operation in errors ("allreduce #12"). Throws TimeoutError naming the
  // peers still pending, IoError naming a peer that died or hung up,
  // RemoteError when the communicator was aborted (by any rank).
  virtual void Wait(const std::vector<RequestId>& ids, Deadline deadline,
                    const std::string& what) = 0;

  // As Wait, but returns false when `deadline` passes first, leaving the
  // requests posted and the transport usable (Wait breaks it on a timeout).
  // For progress in the background: buffered sends nobody else waits for.
  virtual bool TryWait(const std::vector<RequestId>& ids, Deadline deadline,
                       const std::string& what) = 0;

  // Blocks until at least one request in `ids` is complete; returns the
  // index (into `ids`) of one that is. Errors as Wait.
  virtual std::size_t WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                              const std::string& what) = 0;

  // Makes every rank's pending and future waits fail with `reason`.
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace neuron::collectives::transport
