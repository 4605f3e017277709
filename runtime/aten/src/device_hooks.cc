// PyTorch's hooks for the PrivateUse1 ("neuron") device: availability, the
// device count and current device (torch.accelerator), generators, pinned
// memory, and resizing storages.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/generator.h"
#include "neuron/aten/pinned_allocator.h"
#include "neuron/aten/registration.h"

namespace neuron::aten {

const at::Generator& DefaultGenerator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator>* generators = nullptr;
  std::call_once(once, [] {
    generators = new std::vector<at::Generator>();
    for (int i = 0; i < Inventory().count; ++i) {
      generators->push_back(at::make_generator<NeuronGenerator>(c10::default_rng_seed_val));
    }
  });
  return (*generators)[static_cast<std::size_t>(CheckIndex(index, "generator"))];
}

namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return Inventory().count > 0; }
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(Inventory().count);
  }
  void setCurrentDevice(c10::DeviceIndex device) const override { SetCurrentDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return CurrentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = CurrentDevice();
    SetCurrentDevice(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return DefaultGenerator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<NeuronGenerator>(c10::default_rng_seed_val);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(c10::DeviceType::PrivateUse1, CurrentDevice());
  }
  // Device memory is host memory: pinning is a CPU allocation, remembered.
  bool isPinnedPtr(const void* ptr) const override { return IsPinned(ptr); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return PinnedAllocator(); }
  // Storage.resize_ on "neuron" (torch.UntypedStorage): new memory from the
  // storage's allocator on the storage's device, the bytes that fit kept.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    c10::Allocator* allocator = storage.allocator();
    TORCH_CHECK(allocator != nullptr, "Trying to resize storage without an allocator");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = allocator->allocate(bytes);
    const std::size_t keep = std::min(bytes, storage.nbytes());
    if (keep > 0) std::memcpy(fresh.get(), storage.data(), keep);
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(bytes);
  }
};

}  // namespace

void RegisterHooks() {
  static NeuronHooks* hooks = new NeuronHooks();
  at::RegisterPrivateUse1HooksInterface(hooks);
}

}  // namespace neuron::aten
