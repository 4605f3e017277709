#include "neuron/aten/op_log.h"

#include "neuron/aten/device_trace.h"

namespace neuron::aten {

OpLog& OpLog::Get() {
  static OpLog* log = new OpLog();  // lives past exit: ops may run during teardown
  return *log;
}

void OpLog::Add(EagerRecord record) {
  if (DeviceTrace::Recording()) DeviceTrace::Add(record);  // a torch.profiler session
  std::lock_guard<std::mutex> lock(mutex_);
  ++totals_.operations;
  totals_.modelled_us += record.modelled_us;
  totals_.wall_us += record.wall_us;
  totals_.bytes += record.bytes;
  if (records_.size() == kCapacity) records_.pop_front();
  records_.push_back(std::move(record));
}

std::vector<EagerRecord> OpLog::Records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {records_.begin(), records_.end()};
}

EagerTotals OpLog::Totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

void OpLog::Reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.clear();
  totals_ = EagerTotals{};
}

}  // namespace neuron::aten
