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
#include <ostream>
#include <string>
#include <vector>

namespace neuron::collectives::transport {

using Clock = std::chrono::steady_clock;

// A wait's time limit. After(timeout) does not read the clock: the limit is
// fixed by the wait's first look at the clock, which a wait whose requests
// are already done never takes (reading the clock was a fifth of a small
// allreduce). So the timeout counts from when the wait first found it had
// to wait.
class Deadline {
 public:
  static Deadline After(std::chrono::milliseconds timeout) {
    Deadline d;
    d.timeout_ = timeout;
    return d;
  }
  static Deadline Until(Clock::time_point at) {
    Deadline d;
    d.at_ = at;
    d.fixed_ = true;
    return d;
  }
  // The limit; the first call fixes it at now + timeout.
  Clock::time_point At(Clock::time_point now) {
    if (!fixed_) {
      at_ = now + timeout_;
      fixed_ = true;
    }
    return at_;
  }

 private:
  std::chrono::milliseconds timeout_{0};
  Clock::time_point at_{};
  bool fixed_ = false;
};

// What an operation is called in errors ("allreduce #12 of 1024 f32 (sum)").
// A label refers to its text, or to a function that makes it when an error
// needs it: describing every operation up front cost a tenth of a small
// allreduce. Only a parameter: what it refers to must outlive the call.
class Label {
 public:
  Label(const std::string& text) : text_(&text) {}  // NOLINT: implicit on purpose
  Label(std::string&&) = delete;  // would dangle when kept in a variable
  Label(const char* text) : literal_(text != nullptr ? text : "") {}  // NOLINT
  // make(context) builds the text.
  Label(std::string (*make)(const void*), const void* context)
      : make_(make), context_(context) {}

  std::string str() const {
    if (text_ != nullptr) return *text_;
    if (literal_ != nullptr) return literal_;
    return make_(context_);
  }

 private:
  const std::string* text_ = nullptr;
  const char* literal_ = nullptr;
  std::string (*make_)(const void*) = nullptr;
  const void* context_ = nullptr;
};

inline std::ostream& operator<<(std::ostream& out, const Label& label) {
  return out << label.str();
}

using RequestId = std::uint64_t;

class SharedWindows;  // shared_windows.h

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
                    const Label& what) = 0;

  // As Wait, but returns false when `deadline` passes first, leaving the
  // requests posted and the transport usable (Wait breaks it on a timeout).
  // For progress in the background: buffered sends nobody else waits for.
  virtual bool TryWait(const std::vector<RequestId>& ids, Deadline deadline,
                       const Label& what) = 0;

  // Blocks until at least one request in `ids` is complete; returns the
  // index (into `ids`) of one that is. Errors as Wait.
  virtual std::size_t WaitAny(const std::vector<RequestId>& ids, Deadline deadline,
                              const Label& what) = 0;

  // Makes every rank's pending and future waits fail with `reason`.
  virtual void Abort(const std::string& reason) = 0;

  // The shared windows of the group (shared_windows.h) when this transport
  // offers them (every rank maps every other's memory), else null.
  virtual SharedWindows* windows() { return nullptr; }
};

}  // namespace neuron::collectives::transport
