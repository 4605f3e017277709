// Asynchronous collectives: a Communicator driven by its own progress thread.
//
// Operations are queued and run one after another in the order they were
// enqueued (every rank must enqueue the same sequence); each returns a Work
// handle. Buffers must stay valid until the work completes.
//
// Usage:
//   AsyncCommunicator async(std::make_unique<Communicator>(store, rank, size));
//   auto work = async.Enqueue([&](Communicator& c) {
//     c.AllReduce({grads, n, DataType::kFloat32});
//   });
//   ... compute while the allreduce runs ...
//   work->Wait();  // rethrows the operation's error, if any
//
// Two lanes, each with its own thread: collectives, and point-to-point
// (Send/Recv only, on the communicator's separate point-to-point channel).
// So a receive waiting for its sender never holds up the collectives, and
// the other way round; within a lane, operations run in enqueue order.
//
// Abort() (from any thread) makes the running operations fail on every rank
// and every queued one fail without running.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "neuron/collectives/communicator.h"

namespace neuron::runtime {
class OpTrace;
}  // namespace neuron::runtime

namespace neuron::collectives {

// The handle of one asynchronous operation. Thread-safe.
class Work {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kForever = Duration::max();

  // Blocks until the operation ends, then rethrows its error if it failed.
  // Throws TimeoutError when `timeout` passes first (the operation goes on).
  // A successful wait joins the rank's simulated clocks: its compute stream
  // continues at the end of the operation on the collective stream.
  void Wait(Duration timeout = kForever);
  // True once the operation ended, successfully or not; never blocks.
  bool Test() const;
  // The operation's error once it failed, else null.
  std::exception_ptr exception() const;
  // What the work does ("allreduce", ...), for messages.
  const std::string& description() const { return description_; }
  // Runs `callback(error)` once the work ends (at once, on this thread, when
  // it already has): on the progress thread, so it must not block for long.
  void OnDone(std::function<void(std::exception_ptr)> callback);

  explicit Work(std::string description) : description_(std::move(description)) {}
  // `on_wait` runs at every successful Wait (joining the clocks).
  void Finish(std::exception_ptr error, std::function<void()> on_wait = nullptr);
  // A recorded operation: each Wait is recorded as a wait on `issue`.
  void set_trace(std::shared_ptr<runtime::OpTrace> trace, std::uint64_t issue);

 private:
  std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> on_wait_;
  std::vector<std::function<void(std::exception_ptr)>> callbacks_;
  std::shared_ptr<runtime::OpTrace> trace_;
  std::uint64_t trace_issue_ = 0;
};

class AsyncCommunicator {
 public:
  using Operation = std::function<void(Communicator&)>;
  enum class Lane { kCollectives, kPointToPoint };

  explicit AsyncCommunicator(std::unique_ptr<Communicator> communicator);
  // Runs what is still queued, then stops the progress thread.
  ~AsyncCommunicator();
  AsyncCommunicator(const AsyncCommunicator&) = delete;
  AsyncCommunicator& operator=(const AsyncCommunicator&) = delete;

  // Queues `op` behind everything enqueued before it on `lane`. An operation
  // on the point-to-point lane may call only Send and Recv.
  std::shared_ptr<Work> Enqueue(Operation op, std::string description = "collective",
                                Lane lane = Lane::kCollectives);
  void Abort(const std::string& reason);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // While idle, the point-to-point lane moves buffered sends in slices of
  // this much; at shutdown it gives them at most kFinalSendFlush to leave.
  static constexpr std::chrono::milliseconds kSendProgressSlice{1};
  static constexpr std::chrono::milliseconds kFinalSendFlush{10000};
  // An operation as the compute stream issued it: its simulated start
  // counts from the compute clock then, not from when the lane runs it.
  struct Item {
    Operation op;
    std::shared_ptr<Work> work;
    double issued_us = 0;
    std::shared_ptr<runtime::OpTrace> trace;  // recording: the issue's entry
    std::uint64_t trace_index = 0;
  };
  struct Queue {
    std::condition_variable queued;
    std::deque<Item> items;
  };
  void Run(Queue& queue, bool collective);
  void RunOne(Item& item, bool collective);

  std::unique_ptr<Communicator> communicator_;
  const int rank_;
  const int size_;
  std::mutex mutex_;  // guards both queues, stopping_ and abort_reason_
  Queue collectives_;
  Queue point_to_point_;
  bool stopping_ = false;
  std::string abort_reason_;  // set once aborted
  // Last: they start after everything above exists.
  std::thread collectives_thread_;
  std::thread point_to_point_thread_;
};

}  // namespace neuron::collectives
