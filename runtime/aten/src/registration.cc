#include "neuron/aten/registration.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/cpu_fallback.h"

namespace neuron::aten {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::PrivateUse1;

// Operators with both a CPU kernel and a CompositeExplicitAutograd (or
// ...NonFunctional) kernel: PyTorch would run the composite one on a
// PrivateUse1 tensor and never reach the fallback, so native_layer_norm,
// for one, would run its decomposition and differ from the CPU in the last
// bit. Each gets the fallback as its own PrivateUse1 kernel.
void RegisterCpuKernelsOverComposites() {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", kKey, __FILE__,
                                            __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    if (op->hasKernelForDispatchKey(kKey) || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      continue;
    }
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
  }
}

}  // namespace

void RegisterNeuronDevice() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::register_privateuse1_backend("neuron");
    // PyTorch's allocator of the device: storages made on "neuron"
    // (torch.UntypedStorage, torch.load, deepcopy) and torch.accelerator's
    // memory calls reach it.
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &CachingAllocator::Get());
    RegisterHooks();
    RegisterCpuKernelsOverComposites();
  });
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

// Autocast on "neuron" follows CUDA's rules (at::autocast's op lists).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  using at::autocast::CastPolicy;
#define NEURON_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
#undef NEURON_LOWER_PRECISION
#undef NEURON_FP32
#undef NEURON_FP32_SET_OPT_DTYPE
#undef NEURON_PROMOTE
}

}  // namespace neuron::aten
