// torch.profiler's device activity for "neuron": a Kineto activity profiler
// registered as PyTorch's PrivateUse1 profiler (REGISTER_PRIVATEUSE1_PROFILER,
// torch/csrc/profiler/standalone/privateuse1_profiler.h). With
// ProfilerActivity.PrivateUse1 requested, Kineto asks for kernel activities
// (CONCURRENT_KERNEL) and runs a session here: it records the device's eager
// ops (DeviceTrace) and hands each back as a kernel linked to the host op
// that issued it, so key_averages() has a device column holding each op's
// modelled time and export_chrome_trace a lane per device.
//
// The simulated device is synchronous and priced, not timed: a kernel's
// duration is the device model's time for the op (EagerRecord::modelled_us,
// to the nanosecond). It starts when the host issued it or when the previous
// kernel on that device ended, whichever is later, as on a device queue;
// its start on the rank's simulated compute clock is in its "sim start us".
//
// Built with USE_KINETO and without the precompiled header (runtime/aten/
// CMakeLists.txt): the Kineto headers need it and nothing else here sees it.
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "neuron/aten/device_trace.h"

namespace neuron::aten {
namespace {

using libkineto::ActivityType;

constexpr int kComputeLane = 0;  // one lane per device: the compute clock

std::string KernelName(const DeviceOp& op) {
  return std::string(op.op) + " [" + op.kind + "]";
}

// One profiling window's device ops.
class NeuronProfilerSession : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    DeviceTrace::Start();
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    ops_ = DeviceTrace::Stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) { return nullptr; }, 0, 0);
  }
  // Makes one kernel activity per op, linked to its host op, and logs it.
  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t start_ns,
                    int64_t end_ns) override;

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{device_, device_, "neuron", "neuron " + std::to_string(device_)});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {libkineto::ResourceInfo{kComputeLane, kComputeLane, device_,
                                    "compute (modelled)"}};
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(buffer_));
  }

  void pushCorrelationId(uint64_t id) override { DeviceTrace::PushCorrelation(id); }
  void popCorrelationId() override { DeviceTrace::PopCorrelation(); }

 private:
  std::vector<DeviceOp> ops_;
  libkineto::CpuTraceBuffer buffer_;
  int64_t device_ = 0;
};

void NeuronProfilerSession::processTrace(libkineto::ActivityLogger& logger,
                                         libkineto::getLinkedActivityCallback linked,
                                         int64_t start_ns, int64_t end_ns) {
  buffer_.span = libkineto::TraceSpan(start_ns, end_ns, "neuron");
  buffer_.gpuOpCount = static_cast<int>(ops_.size());
  if (!ops_.empty()) device_ = ops_.front().device;
  std::map<int, int64_t> lane_end;  // device -> when its last kernel ended
  for (const DeviceOp& op : ops_) {
    buffer_.emplace_activity(buffer_.span, ActivityType::CONCURRENT_KERNEL, KernelName(op));
    libkineto::GenericTraceActivity& kernel = *buffer_.activities.back();
    int64_t& free_at = lane_end[op.device];
    kernel.startTime = std::max(op.issued_ns, free_at);
    kernel.endTime = kernel.startTime + std::llround(op.modelled_us * 1000.0);
    free_at = kernel.endTime;
    kernel.device = op.device;
    kernel.resource = kComputeLane;
    kernel.id = static_cast<int32_t>(op.correlation);
    if (op.correlation != 0) kernel.linked = linked(static_cast<int32_t>(op.correlation));
    kernel.addMetadataQuoted("kind", op.kind);
    kernel.addMetadata("sim start us", op.start_us);
    kernel.addMetadata("modelled us", op.modelled_us);
    kernel.log(logger);
  }
  ops_.clear();
}

// Runs a session only when the profiler asked for kernels (the PrivateUse1
// activity): a CPU-only profile records nothing here.
class NeuronActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types, const libkineto::Config& /*config*/) override {
    if (types.count(ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<NeuronProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_ = "neuron";
  std::set<ActivityType> activities_ = {ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace
}  // namespace neuron::aten
