#include "neuron/collectives/async_communicator.h"

#include <optional>

#include "issue_context.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/op_trace.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives {

void Work::Finish(std::exception_ptr error, std::function<void()> on_wait) {
  // The callbacks run before waiters wake (as Gloo's work completes its
  // future and ends its profiler record first): once Wait returns, nothing
  // of the operation is still running, on any thread. Callbacks added while
  // these run are run here too.
  std::vector<std::function<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    on_wait_ = std::move(on_wait);
    callbacks.swap(callbacks_);
  }
  while (true) {
    for (auto& callback : callbacks) callback(error);
    callbacks.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    if (callbacks_.empty()) {
      done_ = true;
      break;
    }
    callbacks.swap(callbacks_);
  }
  done_cv_.notify_all();
}

void Work::OnDone(std::function<void(std::exception_ptr)> callback) {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(callback));
      return;
    }
    error = error_;
  }
  callback(error);
}

void Work::Wait(Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kForever) {
    done_cv_.wait(lock, [this] { return done_; });
  } else if (!done_cv_.wait_for(lock, timeout, [this] { return done_; })) {
    throw TimeoutError(StrCat(description_, " did not complete within ", timeout.count(),
                              " ms"));
  }
  if (error_) std::rethrow_exception(error_);
  if (trace_) trace_->Wait(trace_issue_);
  if (on_wait_) on_wait_();
}

void Work::set_trace(std::shared_ptr<runtime::OpTrace> trace, std::uint64_t issue) {
  std::lock_guard<std::mutex> lock(mutex_);
  trace_ = std::move(trace);
  trace_issue_ = issue;
}

bool Work::Test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ ? error_ : nullptr;
}

AsyncCommunicator::AsyncCommunicator(std::unique_ptr<Communicator> communicator)
    : communicator_(std::move(communicator)),
      rank_(communicator_->rank()),
      size_(communicator_->size()),
      collectives_thread_([this] { Run(collectives_, true); }),
      point_to_point_thread_([this] { Run(point_to_point_, false); }) {
  communicator_->set_join_compute(false);  // Work::Wait joins instead
  communicator_->set_buffered_sends(true);  // the idle lane moves their bytes
}

AsyncCommunicator::~AsyncCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  collectives_.queued.notify_all();
  point_to_point_.queued.notify_all();
  collectives_thread_.join();
  point_to_point_thread_.join();
}

std::shared_ptr<Work> AsyncCommunicator::Enqueue(Operation op, std::string description,
                                                 Lane lane) {
  auto work = std::make_shared<Work>(std::move(description));
  Queue& queue = lane == Lane::kCollectives ? collectives_ : point_to_point_;
  Item item;
  item.op = std::move(op);
  item.work = work;
  const runtime::SimClock& clock = communicator_->clock();
  item.issued_us = clock.compute().count();
  if ((item.trace = clock.trace()) != nullptr) {
    item.trace_index = item.trace->Issue(lane == Lane::kPointToPoint, false);
    work->set_trace(item.trace, item.trace_index);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    NEURON_CHECK(!stopping_, "enqueue on a communicator that is shutting down");
    queue.items.push_back(std::move(item));
  }
  queue.queued.notify_one();
  return work;
}

void AsyncCommunicator::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
  }
  communicator_->Abort(reason);  // fails the running operations on every rank
  collectives_.queued.notify_all();
  point_to_point_.queued.notify_all();
}

void AsyncCommunicator::Run(Queue& queue, bool collective) {
  // The point-to-point lane keeps buffered sends moving while it is idle
  // (their receivers may wait for bytes only this thread can push), in
  // short slices so a new operation starts promptly.
  bool sends_pending = false;
  while (true) {
    Item next;
    std::string aborted;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      while (sends_pending && queue.items.empty() && !stopping_) {
        lock.unlock();
        sends_pending = communicator_->ProgressSends(kSendProgressSlice);
        lock.lock();
      }
      queue.queued.wait(lock, [&] { return stopping_ || !queue.items.empty(); });
      if (queue.items.empty()) {  // stopping, and nothing left to run
        lock.unlock();
        if (sends_pending) communicator_->ProgressSends(kFinalSendFlush);
        return;
      }
      next = std::move(queue.items.front());
      queue.items.pop_front();
      aborted = abort_reason_;
    }
    if (!aborted.empty()) {
      next.work->Finish(std::make_exception_ptr(RemoteError(StrCat(
          next.work->description(), " on rank ", rank_, " not run: the communicator was "
          "aborted: ", aborted))));
      continue;
    }
    RunOne(next, collective);
    sends_pending = !collective;
  }
}

void AsyncCommunicator::RunOne(Item& item, bool collective) {
  runtime::SimClock* clock = &communicator_->clock();
  detail::IssueContext context;
  context.clock = clock;
  context.issued_us = item.issued_us;
  context.trace = item.trace;
  context.index = item.trace_index;
  try {
    // Collectives leave a record whose end the waiter joins; so does a
    // receive, in the context.
    const std::size_t before = collective ? communicator_->totals().operations : 0;
    {
      detail::ScopedIssue scope(&context);
      item.op(*communicator_);
    }
    std::optional<double> end;
    if (collective && communicator_->totals().operations > before) {
      end = communicator_->records().back().end_us;
    } else if (context.received) {
      end = context.received_us;
    }
    std::function<void()> join;
    // The waiter's compute queued before the wait (adaptive eager) is
    // charged before the clocks join: it overlapped the collective.
    if (end) {
      join = [clock, t = *end] {
        runtime::SettlePendingCompute("sync");
        clock->JoinCompute(runtime::SimDuration(t));
      };
    }
    item.work->Finish(nullptr, std::move(join));
  } catch (...) {
    item.work->Finish(std::current_exception());
  }
}

}  // namespace neuron::collectives
