// The device guard of the "neuron" device (c10's DeviceGuardImplInterface):
// the current device, streams and events.
//
// Operations run synchronously on the calling thread, so every stream is
// always complete and an event is complete once recorded: streams exist so
// that code written for CUDA's (DDP, FSDP2, torch.accelerator) runs.
// An event records the rank's simulated compute clock, so elapsed_time
// gives the modelled milliseconds between two events.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>

#include "neuron/aten/adaptive_eager.h"
#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::aten {
namespace {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// The calling thread's current stream per device (0: the default stream).
thread_local std::map<c10::DeviceIndex, c10::StreamId> current_stream;
std::atomic<c10::StreamId> next_stream{1};

struct NeuronEvent {
  double modelled_us = 0;
  bool recorded = false;
};

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device previous = getDevice();
    if (d.index() != previous.index()) setDevice(d);
    return previous;
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, CurrentDevice()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNeuron, "set_device: expected a neuron device, got ", d);
    try {
      SetCurrentDevice(d.index());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      SetCurrentDevice(d.index());
    } catch (...) {
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(Inventory().count);
    } catch (...) {
      return 0;
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    const c10::DeviceIndex index = d.index() < 0 ? CurrentDevice() : d.index();
    auto it = current_stream.find(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index),
                       it == current_stream.end() ? 0 : it->second);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNeuron, d.index() < 0 ? CurrentDevice() : d.index()));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::UNSAFE,
                       c10::Device(kNeuron, d.index() < 0 ? CurrentDevice() : d.index()),
                       next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream previous = getStream(s.device());
    current_stream[s.device_index()] = s.id();
    return previous;
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  // Operations run synchronously; a sync prices adaptive eager's open region.
  void synchronizeStream(const c10::Stream&) const override { adaptive::Flush("sync"); }
  void synchronizeDevice(c10::DeviceIndex) const override { adaptive::Flush("sync"); }
  // The allocator keeps a block used on another stream active after it is
  // freed, as CUDA's does (caching_allocator.h).
  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& s) const override {
    CachingAllocator::Get().recordStream(ptr, s);
  }

  void record(void** event, const c10::Stream&, c10::DeviceIndex,
              c10::EventFlag) const override {
    if (*event == nullptr) *event = new NeuronEvent();
    auto* e = static_cast<NeuronEvent*>(*event);
    adaptive::Flush("sync");  // the event marks the clock after the work issued before it
    e->modelled_us = runtime::ProcessClock()->compute().count();
    e->recorded = true;
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override { adaptive::Flush("sync"); }
  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    delete static_cast<NeuronEvent*>(event);
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex) const override {
    auto* a = static_cast<NeuronEvent*>(start);
    auto* b = static_cast<NeuronEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "elapsed_time: both events must be recorded first");
    return (b->modelled_us - a->modelled_us) / 1000.0;
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace neuron::aten
