#include "neuron/aten/device_trace.h"

#include <chrono>
#include <mutex>

#include "neuron/aten/devices.h"

namespace neuron::aten {
namespace {

struct Recorded {
  std::mutex mutex;
  std::vector<DeviceOp> ops;
};

Recorded& State() {
  static Recorded* state = new Recorded();  // lives past exit, as OpLog does
  return *state;
}

std::vector<std::uint64_t>& Correlations() {
  thread_local std::vector<std::uint64_t> stack;
  return stack;
}

std::int64_t WallNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void DeviceTrace::Start() {
  Recorded& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.ops.clear();
  recording_.store(true);
}

std::vector<DeviceOp> DeviceTrace::Stop() {
  Recorded& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  recording_.store(false);
  std::vector<DeviceOp> ops;
  ops.swap(state.ops);
  return ops;
}

void DeviceTrace::Add(const EagerRecord& record) {
  if (!Recording()) return;
  const auto& stack = Correlations();
  DeviceOp op{record.op,        record.kind, record.start_us, record.modelled_us,
              WallNanoseconds(), stack.empty() ? 0 : stack.back(),
              static_cast<int>(CurrentDevice())};
  Recorded& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (Recording()) state.ops.push_back(op);
}

void DeviceTrace::PushCorrelation(std::uint64_t id) { Correlations().push_back(id); }

void DeviceTrace::PopCorrelation() {
  auto& stack = Correlations();
  if (!stack.empty()) stack.pop_back();
}

}  // namespace neuron::aten
