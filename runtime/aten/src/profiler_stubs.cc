// The "neuron" device's profiler stubs (torch/csrc/profiler/stubs/base.h,
// registerPrivateUse1Methods), as CUDA's are its events: the autograd
// profiler's legacy device timing, torch.autograd.profiler.profile(
// use_device="neuron") (ProfilerState::KINETO_PRIVATEUSE1_FALLBACK), records
// an event as each profiled operator begins and ends and reports the time
// between the two as the operator's device time.
//
// The device is synchronous and priced: an event is a reading of the rank's
// simulated compute clock (runtime::ProcessClock), so the elapsed time is
// the modelled time charged while the operator ran (its children's included).
// PyTorch keeps it in whole microseconds (KinetoEvent::privateuse1ElapsedUs);
// torch.profiler with ProfilerActivity.PrivateUse1 (kineto_profiler.cc) has
// each op's time to the nanosecond.
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/util/ApproximateClock.h>

#include <functional>
#include <memory>

#include "neuron/aten/devices.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::aten {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

double ComputeClockUs(const ProfilerVoidEventStub& event) {
  return *static_cast<const double*>(event.get());
}

struct NeuronProfilerStubs : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device != nullptr) *device = CurrentDevice();
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    *event = std::make_shared<double>(runtime::ProcessClock()->compute().count());
  }
  // Microseconds, as CUDA's stubs report them.
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    return static_cast<float>(ComputeClockUs(*end) - ComputeClockUs(*start));
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex current = CurrentDevice();
    for (int i = 0; i < Inventory().count; ++i) {
      SetCurrentDevice(static_cast<c10::DeviceIndex>(i));
      op(i);
    }
    SetCurrentDevice(current);
  }
  void synchronize() const override {}  // the device runs each op to completion
};

const bool kRegistered = [] {
  static NeuronProfilerStubs stubs;  // PyTorch keeps the pointer for the process
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace neuron::aten
