#include "neuron/compiler/graph_runs.h"

namespace neuron::compiler {

GraphRunLog& GraphRunLog::Get() {
  static GraphRunLog log;
  return log;
}

void GraphRunLog::SetObserver(Observer observer) {
  observer_.store(observer, std::memory_order_release);
}

void GraphRunLog::Record(GraphRun run) {
  if (Observer observer = observer_.load(std::memory_order_acquire)) observer(run);
  std::lock_guard<std::mutex> lock(mutex_);
  if (runs_.size() == kCapacity) runs_.pop_front();
  runs_.push_back(std::move(run));
  ++total_;
}

std::vector<GraphRun> GraphRunLog::Runs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {runs_.begin(), runs_.end()};
}

std::uint64_t GraphRunLog::total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_;
}

void GraphRunLog::Reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  runs_.clear();
  total_ = 0;
}

}  // namespace neuron::compiler
