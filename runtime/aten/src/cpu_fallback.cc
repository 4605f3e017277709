#include "neuron/aten/cpu_fallback.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <chrono>
#include <optional>
#include <vector>

#include "neuron/aten/adaptive_eager.h"
#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/fallback_report.h"
#include "neuron/aten/host_views.h"
#include "neuron/aten/op_log.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/sim_clock.h"

namespace neuron::aten {
namespace {

bool IsNeuron(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// One run's translation between neuron tensors and their CPU views.
class CpuViews {
 public:
  explicit CpuViews(const OpInfo& info) : info_(info) {}

  // Scans and rewrites the arguments: neuron tensors become CPU views,
  // neuron devices the CPU; then checks that the devices agree.
  void Arguments(torch::jit::Stack* stack, std::size_t count);
  // Rewrites the results: CPU views back to neuron tensors.
  void Results(torch::jit::Stack* stack, std::size_t count);
  // Copies back what the kernel changed in written arguments: a storage it
  // replaced (a resize), and sizes and strides.
  void WriteBack();

  c10::DeviceIndex device() const { return device_ >= 0 ? device_ : CurrentDevice(); }
  c10::ArrayRef<at::Tensor> inputs() const { return inputs_; }
  c10::ArrayRef<at::Tensor> outputs() const { return outputs_; }

 private:
  struct StoragePair {
    c10::StorageImpl* neuron;
    c10::Storage cpu;
    void* base;  // the CPU view's memory before the run
  };
  struct TensorPair {
    at::Tensor neuron;
    at::Tensor cpu;
    bool written;
  };

  // `cpu_scalar`: a one-element CPU tensor may stand here (OpInfo::cpu_scalar).
  c10::IValue Argument(const c10::IValue& value, bool written, bool cpu_scalar);
  at::Tensor Wrap(const at::Tensor& t, bool written);
  at::Tensor Unwrap(const at::Tensor& t);
  c10::Storage CpuStorage(const c10::Storage& neuron);
  c10::Storage NeuronStorage(const c10::Storage& cpu);
  void SeeDevice(c10::Device device);

  const OpInfo& info_;
  c10::DeviceIndex device_ = -1;
  std::optional<c10::DeviceIndex> other_device_;
  bool cpu_tensor_ = false;
  c10::SmallVector<StoragePair, 4> storages_;
  c10::SmallVector<TensorPair, 4> tensors_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> adopted_;  // cpu -> neuron
  c10::SmallVector<at::Tensor, 4> inputs_;
  c10::SmallVector<at::Tensor, 2> outputs_;
};

void CpuViews::SeeDevice(c10::Device device) {
  if (device_ < 0) {
    device_ = device.index() < 0 ? CurrentDevice() : device.index();
  } else if (device.index() >= 0 && device.index() != device_) {
    other_device_ = device.index();
  }
}

c10::Storage CpuViews::CpuStorage(const c10::Storage& neuron) {
  for (const auto& s : storages_) {
    if (s.neuron == neuron.unsafeGetStorageImpl()) return s.cpu;
  }
  // Resizable: a kernel that resizes an out= argument gets new memory,
  // which WriteBack adopts.
  c10::Storage cpu = HostStorage(neuron, /*resizable=*/true);
  void* base = cpu.nbytes() == 0 ? nullptr : cpu.mutable_data();
  storages_.push_back({neuron.unsafeGetStorageImpl(), cpu, base});
  return cpu;
}

at::Tensor CpuViews::Wrap(const at::Tensor& t, bool written) {
  SeeDevice(t.device());
  CheckType(info_, t);  // before the kernel runs: nothing is changed
  for (const auto& p : tensors_) {
    if (p.neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      inputs_.push_back(p.cpu);  // an operand twice (a @ a) is read twice
      return p.cpu;
    }
  }
  at::Tensor cpu = TensorOn(CpuStorage(t.storage()), c10::DispatchKey::CPU, t);
  tensors_.push_back({t, cpu, written});
  inputs_.push_back(cpu);
  return cpu;
}

c10::IValue CpuViews::Argument(const c10::IValue& value, bool written, bool cpu_scalar) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (IsNeuron(t)) return Wrap(t, written);
    if (t.defined() && t.device().is_cpu() && t.dim() > 0 && !(cpu_scalar && t.numel() == 1)) {
      cpu_tensor_ = true;
    }
    if (t.defined()) inputs_.push_back(t);
    return value;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) {
      list.push_back(IsNeuron(t) ? Wrap(t, written) : t);
      if (t.defined() && t.device().is_cpu() && t.dim() > 0) cpu_tensor_ = true;
    }
    return list;
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      if (t && IsNeuron(*t)) {
        list.push_back(Wrap(*t, written));
      } else {
        if (t && t->defined() && t->device().is_cpu() && t->dim() > 0) cpu_tensor_ = true;
        list.push_back(t);
      }
    }
    return list;
  }
  if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
    SeeDevice(value.toDevice());
    return c10::IValue(c10::Device(c10::DeviceType::CPU));
  }
  return value;
}

void CpuViews::Arguments(torch::jit::Stack* stack, std::size_t count) {
  auto args = stack->end() - static_cast<std::ptrdiff_t>(count);
  for (std::size_t i = 0; i < count; ++i) {
    args[i] = Argument(args[i], i < info_.written.size() && info_.written[i],
                       i < info_.cpu_scalar.size() && info_.cpu_scalar[i]);
  }
  if (other_device_) {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                "devices, neuron:", static_cast<int>(device_), " and neuron:",
                static_cast<int>(*other_device_), "! (when running ", info_.name, ")");
  }
  TORCH_CHECK(!(cpu_tensor_ && device_ >= 0 && !info_.cpu_arguments_ok),
              "Expected all tensors to be on the same device, but found at least two devices, "
              "neuron:", static_cast<int>(device_), " and cpu! (when running ", info_.name, ")");
  for (std::size_t i = 0; i < count && i < info_.generator.size(); ++i) {
    if (info_.generator[i] && args[i].isNone()) args[i] = DefaultGenerator(device());
  }
}

c10::Storage CpuViews::NeuronStorage(const c10::Storage& cpu) {
  for (const auto& s : storages_) {
    if (s.cpu.unsafeGetStorageImpl() == cpu.unsafeGetStorageImpl()) {
      return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s.neuron));
    }
  }
  for (const auto& [impl, neuron] : adopted_) {
    if (impl == cpu.unsafeGetStorageImpl()) return neuron;
  }
  CachingAllocator& allocator = CachingAllocator::Get();
  c10::Storage neuron(c10::Storage::use_byte_size_t(), cpu.nbytes(),
                      allocator.Adopt(cpu, device()), &allocator, /*resizable=*/true);
  adopted_.emplace_back(cpu.unsafeGetStorageImpl(), neuron);
  return neuron;
}

at::Tensor CpuViews::Unwrap(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu()) return t;
  outputs_.push_back(t);
  for (const auto& p : tensors_) {
    if (p.cpu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return p.neuron;
  }
  return TensorOn(NeuronStorage(t.storage()), c10::DispatchKey::PrivateUse1, t);
}

void CpuViews::Results(torch::jit::Stack* stack, std::size_t count) {
  auto results = stack->end() - static_cast<std::ptrdiff_t>(count);
  for (std::size_t i = 0; i < count; ++i) {
    c10::IValue& r = results[i];
    if (r.isTensor()) {
      r = Unwrap(r.toTensor());
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : r.toTensorList()) list.push_back(Unwrap(t));
      r = list;
    }
  }
}

void CpuViews::WriteBack() {
  for (auto& s : storages_) {
    void* now = s.cpu.nbytes() == 0 ? nullptr : s.cpu.mutable_data();
    if (now == s.base) continue;
    // The kernel resized the view's storage into CPU memory: adopt it.
    c10::Storage neuron(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s.neuron));
    neuron.set_nbytes(s.cpu.nbytes());
    neuron.set_data_ptr_noswap(CachingAllocator::Get().Adopt(s.cpu, device()));
  }
  for (auto& p : tensors_) {
    if (!p.written) continue;
    auto* impl = p.neuron.unsafeGetTensorImpl();
    if (impl->sizes() != p.cpu.sizes() || impl->strides() != p.cpu.strides() ||
        impl->storage_offset() != p.cpu.storage_offset()) {
      impl->set_sizes_and_strides(p.cpu.sizes(), p.cpu.strides(), p.cpu.storage_offset());
    }
  }
}

const runtime::CostModel& Model() {
  static const runtime::CostModel model(runtime::DeviceSpec::FromEnvironment());
  return model;
}

double MicrosecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// Adaptive eager (adaptive_eager.h): queues the run just made into the
// open region, unless it is a view (nothing to charge) or the pricer
// refuses it (the region is flushed; the caller charges it). A result that
// is no tensor (.item()) is a host read: the region is flushed first.
bool Queued(const OpInfo& info, const runtime::EagerOp& op, double wall_us,
            std::vector<adaptive::Argument> captured, const torch::jit::Stack& stack,
            const c10::FunctionSchema& schema) {
  c10::SmallVector<at::Tensor, 4> results;
  auto returned = stack.end() - static_cast<std::ptrdiff_t>(schema.returns().size());
  for (; returned != stack.end(); ++returned) {
    if (returned->isTensor()) {
      results.push_back(returned->toTensor());
    } else if (returned->isTensorList()) {
      for (const at::Tensor& t : returned->toTensorList()) results.push_back(t);
    } else {
      adaptive::Flush("host_read");
      return false;
    }
  }
  if (op.kind == runtime::EagerKind::kView) return false;
  return adaptive::Queue(info, op, EagerCostOf(op).count(), wall_us, std::move(captured),
                         results);
}

}  // namespace

runtime::SimDuration EagerCostOf(const runtime::EagerOp& op) {
  return runtime::EagerCost(Model(), op);
}

void Charge(const OpInfo& info, const runtime::EagerOp& op, double wall_us,
            c10::DeviceIndex device) {
  const runtime::SimDuration cost = runtime::EagerCost(Model(), op);
  if (op.kind == runtime::EagerKind::kView) return;
  static runtime::SimClock* const clock = runtime::ProcessClock().get();  // lives forever
  const double start = clock->compute().count();
  clock->AdvanceCompute(cost);
  OpLog::Get().Add({info.name.c_str(), start, cost.count(), wall_us, op.bytes_in + op.bytes_out,
                    runtime::Name(op.kind), CachingAllocator::Get().Allocated(device)});
  if (op.kind == runtime::EagerKind::kFallback && FallbackReport::Recording()) {
    FallbackReport::Add(info.name.c_str(), cost.count());  // torch.neuron.fallback_report
  }
}

void RunOnCpu(const c10::OperatorHandle& target, const OpInfo& info,
              torch::jit::Stack* stack) {
  const auto start = std::chrono::steady_clock::now();
  const auto& schema = target.schema();
  TORCH_CHECK_NOT_IMPLEMENTED(
      info.support != runtime::Support::kUnsupported, "The operator '", info.name,
      "' is not supported on the neuron device: ", info.reason,
      ". Run it on the CPU: move its inputs there with .cpu(), and its results back with "
      ".to(\"neuron\").");
  TORCH_CHECK_NOT_IMPLEMENTED(
      (&target.schema() == info.schema ? info : InfoOf(target)).cpu_kernel, "The operator '", info.name,
      "' has no kernel for the neuron device and no CPU kernel to run in its place. Run it on "
      "the CPU: move its inputs there with .cpu(), and its results back with .to(\"neuron\").");
  // A scan's dim, read before the call consumes the arguments.
  std::int64_t scan_dim = 0;
  const bool scan = info.scan_dim_argument >= 0;
  if (scan) {
    const auto& dim = torch::jit::peek(*stack, static_cast<std::size_t>(info.scan_dim_argument),
                                       schema.arguments().size());
    scan_dim = dim.isInt() ? dim.toInt() : 0;
  }
  // Adaptive eager: the arguments as they are before the kernel consumes them.
  const bool adaptive = adaptive::Enabled();
  std::vector<adaptive::Argument> captured;
  if (adaptive) captured = adaptive::Capture(*stack, schema.arguments().size());
  CpuViews views(info);
  views.Arguments(stack, schema.arguments().size());
  target.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  views.WriteBack();
  views.Results(stack, schema.returns().size());
  runtime::EagerOp op = Describe(info, views.inputs(), views.outputs());
  if (scan && !views.inputs().empty()) DescribeScan(views.inputs()[0], scan_dim, op);
  // Nothing written, every result a view of an argument: metadata only.
  bool fresh = false;
  for (const auto& t : views.outputs()) {
    bool alias = false;
    for (const auto& in : views.inputs()) alias |= t.is_alias_of(in);
    fresh |= !alias;
  }
  if ((!fresh && !info.writes && !views.outputs().empty()) ||
      info.support == runtime::Support::kHostOnly) {
    op.kind = runtime::EagerKind::kView;
  }
  const double wall_us = MicrosecondsSince(start);
  if (adaptive && Queued(info, op, wall_us, std::move(captured), *stack, schema)) return;
  Charge(info, op, wall_us, views.device());
}

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  RunOnCpu(op, InfoOf(op), stack);
}

}  // namespace neuron::aten
