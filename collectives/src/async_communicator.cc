#include "neuron/collectives/async_communicator.h"

#include "neuron/runtime/error.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::collectives {

void Work::Finish(std::exception_ptr error, std::function<void()> on_wait) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
    on_wait_ = std::move(on_wait);
  }
  done_cv_.notify_all();
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
  if (on_wait_) on_wait_();
}

bool Work::Test() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

AsyncCommunicator::AsyncCommunicator(std::unique_ptr<Communicator> communicator)
    : communicator_(std::move(communicator)),
      rank_(communicator_->rank()),
      size_(communicator_->size()),
      thread_([this] { Run(); }) {
  communicator_->set_join_compute(false);  // Work::Wait joins instead
}

AsyncCommunicator::~AsyncCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  thread_.join();
}

std::shared_ptr<Work> AsyncCommunicator::Enqueue(Operation op, std::string description) {
  auto work = std::make_shared<Work>(std::move(description));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    NEURON_CHECK(!stopping_, "enqueue on a communicator that is shutting down");
    queue_.emplace_back(std::move(op), work);
  }
  queued_.notify_one();
  return work;
}

void AsyncCommunicator::Abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
  }
  communicator_->Abort(reason);  // fails the running operation on every rank
  queued_.notify_all();
}

void AsyncCommunicator::Run() {
  while (true) {
    std::pair<Operation, std::shared_ptr<Work>> next;
    std::string aborted;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      next = std::move(queue_.front());
      queue_.pop_front();
      aborted = abort_reason_;
    }
    if (!aborted.empty()) {
      next.second->Finish(std::make_exception_ptr(RemoteError(StrCat(
          next.second->description(), " on rank ", rank_, " not run: the communicator was "
          "aborted: ", aborted))));
      continue;
    }
    try {
      const std::size_t before = communicator_->totals().operations;
      next.first(*communicator_);
      std::function<void()> join;
      if (communicator_->totals().operations > before) {
        const double end = communicator_->records().back().end_us;
        runtime::SimClock* clock = &communicator_->clock();
        join = [clock, end] { clock->JoinCompute(runtime::SimDuration(end)); };
      }
      next.second->Finish(nullptr, std::move(join));
    } catch (...) {
      next.second->Finish(std::current_exception());
    }
  }
}

}  // namespace neuron::collectives
