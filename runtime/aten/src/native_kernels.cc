// The kernels the "neuron" device registers itself, where running the CPU's
// would be wrong: allocation (the caching allocator), views and storage
// changes (on the neuron storage itself), copies between devices (a DMA on
// the device model), dropout (the CPU's draws from the CPU's generator),
// and convolution (PyTorch routes a PrivateUse1 convolution to
// convolution_overrideable, which has no CPU kernel).
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <chrono>

#include "neuron/aten/adaptive_eager.h"
#include "neuron/aten/caching_allocator.h"
#include "neuron/aten/cpu_fallback.h"
#include "neuron/aten/devices.h"
#include "neuron/aten/host_views.h"
#include "neuron/aten/op_info.h"

namespace neuron::aten {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::PrivateUse1;

c10::Device Where(std::optional<c10::Device> device) {
  const c10::DeviceIndex index = device && device->has_index() ? device->index() : -1;
  return c10::Device(c10::DeviceType::PrivateUse1, CheckIndex(index, "empty"));
}

at::Tensor Empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                 std::optional<at::Layout>, std::optional<c10::Device> device,
                 std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(Where(device));
  return at::detail::empty_generic(size, &CachingAllocator::Get(), c10::DispatchKeySet(kKey),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor EmptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<c10::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(Where(device));
  return at::detail::empty_strided_generic(size, stride, &CachingAllocator::Get(),
                                           c10::DispatchKeySet(kKey),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& Resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& SetStorage(at::Tensor& self, c10::Storage source, int64_t offset,
                       c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: a neuron tensor cannot use memory of device ", source.device());
  c10::DeviceGuard guard(self.device());
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  std::optional<c10::IntArrayRef> strides;
  if (!stride.empty()) strides = stride;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), size, strides);
  return self;
}

at::Tensor& SetStorageWhole(at::Tensor& self, c10::Storage source) {
  const int64_t elements = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return SetStorage(self, std::move(source), 0, {elements}, {});
}

at::Tensor& SetTensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return SetStorage(self, source.storage(), source.storage_offset(), source.sizes(),
                    source.strides());
}

at::Tensor& SetEmpty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &CachingAllocator::Get(), true);
  return SetStorage(self, std::move(storage), 0, {0}, {});
}

// A CPU tensor over the memory of a tensor of either device (no copy).
at::Tensor HostView(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  return TensorOn(HostStorage(t.storage(), /*resizable=*/false), c10::DispatchKey::CPU, t);
}

const OpInfo& CopyInfo() {
  static const OpInfo& info = InfoOf(
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_copy_from", ""));
  return info;
}

// Adaptive eager (adaptive_eager.h): a copy between neuron tensors is
// queued into the open region (as _copy_from(self, dst), its result dst);
// a copy to the host reads the region's results, one from the host is
// charged after them: both flush it. Returns whether it was queued.
bool AdaptiveCopy(const at::Tensor& self, const at::Tensor& dst, const runtime::EagerOp& op,
                  double wall_us) {
  const bool self_neuron = self.device().is_privateuseone();
  const bool dst_neuron = dst.device().is_privateuseone();
  if (self_neuron && dst_neuron) {
    std::vector<adaptive::Argument> arguments(3);
    arguments[0].kind = arguments[1].kind = adaptive::Argument::Kind::kTensor;
    arguments[0].tensors.push_back(adaptive::TensorRef::Of(self));
    arguments[1].tensors.push_back(adaptive::TensorRef::Of(dst));
    return adaptive::Queue(CopyInfo(), op, EagerCostOf(op).count(), wall_us,
                           std::move(arguments), {dst});
  }
  adaptive::Flush(dst_neuron ? "host_write" : "host_read");
  return false;
}

// self -> dst, either of them on the device: a DMA on the device model.
at::Tensor CopyFrom(const at::Tensor& self, const at::Tensor& dst, bool) {
  const auto start = std::chrono::steady_clock::now();
  HostView(dst).copy_(HostView(self));
  runtime::EagerOp op;
  op.kind = runtime::EagerKind::kCopy;
  op.bytes_in = static_cast<std::uint64_t>(self.numel()) * self.element_size();
  op.bytes_out = static_cast<std::uint64_t>(dst.numel()) * dst.element_size();
  const c10::Device device = dst.device().is_cpu() ? self.device() : dst.device();
  const double wall_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
          .count();
  if (adaptive::Enabled() && AdaptiveCopy(self, dst, op, wall_us)) return dst;
  Charge(CopyInfo(), op, wall_us, device.index());
  return dst;
}

at::Tensor CopyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    c10::DeviceGuard guard(dst.device());
    const_cast<at::Tensor&>(dst).resize_(self.sizes());
  }
  return CopyFrom(self, dst, false);
}

// Tensor.record_stream: the allocator keeps the storage's block active
// after it is freed until the stream's use is processed (caching_allocator.h).
void RecordStream(at::Tensor& self, c10::Stream stream) {
  CachingAllocator::Get().recordStream(self.storage().data_ptr(), stream);
}

// The CPU's native_dropout, step by step on the device: the CPU kernel
// takes no generator and would draw from the CPU's default one, so DTensor's
// RNG tracker and fork_rng on "neuron" would not reach dropout. Here the
// mask's bernoulli_ draws from the device's generator (the same numbers as
// the CPU's after the same seed).
std::tuple<at::Tensor, at::Tensor> NativeDropout(const at::Tensor& input, double p,
                                                 std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input)};
  const auto bool_options = input.options().dtype(at::kBool);
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, bool_options)};
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;  // p == 1: zeros, not NaN
  at::Tensor mask = at::empty_like(input, bool_options);
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

// convolution_overrideable has aten::convolution's arguments.
void ConvolutionOverrideable(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const auto target =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  RunOnCpu(target, InfoOf(op), stack);
}

// convolution_backward_overrideable lacks convolution_backward's bias_sizes
// (its 4th argument): the output channels.
void ConvolutionBackwardOverrideable(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const auto target =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  const std::size_t n = op.schema().arguments().size();
  auto args = stack->end() - static_cast<std::ptrdiff_t>(n);
  const at::Tensor weight = args[2].toTensor();
  const bool transposed = args[6].toBool();
  const int64_t groups = args[8].toInt();
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(args + 3, c10::IValue(std::vector<int64_t>{channels}));
  RunOnCpu(target, InfoOf(target), stack);
}

// `param.data = param.to("neuron")` (FSDP2 moving CPU-initialised or
// offloaded parameters, Module.to): c10 lets a tensor take another's
// storage in place only between the dense backends it knows, and leaves
// PrivateUse1 to say. A dense strided "neuron" tensor and a dense strided
// CPU or "neuron" tensor are the same TensorImpl: compatible.
bool HasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided &&
           (t.device().is_cpu() || t.device().is_privateuseone()) &&
           t.key_set().has(c10::DispatchKey::Dense);
  };
  return self.key_set() == from.key_set() || (dense(self) && dense(from));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(HasCompatibleShallowCopyType));
  m.impl("empty.memory_format", TORCH_FN(Empty));
  m.impl("empty_strided", TORCH_FN(EmptyStrided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(Resize));
  m.impl("set_.source_Storage", TORCH_FN(SetStorageWhole));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(SetStorage));
  m.impl("set_.source_Tensor", TORCH_FN(SetTensor));
  m.impl("set_", TORCH_FN(SetEmpty));
  m.impl("_copy_from", TORCH_FN(CopyFrom));
  m.impl("_copy_from_and_resize", TORCH_FN(CopyFromAndResize));
  m.impl("record_stream", TORCH_FN(RecordStream));
  m.impl("native_dropout", TORCH_FN(NativeDropout));
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&ConvolutionOverrideable>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&ConvolutionBackwardOverrideable>());
}

}  // namespace neuron::aten
