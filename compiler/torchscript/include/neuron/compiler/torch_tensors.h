// Tensors across the torch boundary: dense torch tensors to the
// runtime's HostTensors (executor inputs) and back, for the frontends that
// see torch (the Python bindings, the TorchScript frontend and its users).
//
//   runtime::HostTensor h = ToHost(torch::randn({4, 8}));
//   at::Tensor held;
//   runtime::HostView v = ViewOf(x, &held);  // x's bytes, while `held` lives
//   at::Tensor t = FromHost(executor_output);
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "neuron/runtime/device/executor.h"

namespace neuron::compiler {

// The device's element type of a torch dtype; InvalidUsage names the dtype
// the device does not take (float64, complex, ...).
runtime::proto::ElementType ElementTypeOf(at::ScalarType type);
at::ScalarType ScalarTypeOf(runtime::proto::ElementType type);
// The IR's name of a torch dtype ("f32", ...); InvalidUsage, naming `where`,
// for one the device does not take.
std::string IrDtypeOf(at::ScalarType type, const std::string& where);

// A contiguous copy of a dense tensor on the CPU or on the "neuron" device
// (PrivateUse1, whose memory is this host's); InvalidUsage otherwise.
runtime::HostTensor ToHost(const at::Tensor& tensor);
// The same tensor's bytes without a copy: `tensor` made contiguous (a copy
// only when it is not) into `*held`, which must outlive the view.
runtime::HostView ViewOf(const at::Tensor& tensor, at::Tensor* held);
// A new tensor on `device` (the CPU, or "neuron") holding `host`'s elements.
at::Tensor FromHost(const runtime::HostTensor& host, c10::Device device = c10::Device("cpu"));
// The same, taking the host bytes over: a CPU tensor owns them without a
// copy (another device's, or NEURON_SHARED_TENSORS's allocator, gets a copy).
at::Tensor FromHost(runtime::HostTensor&& host, c10::Device device = c10::Device("cpu"));

}  // namespace neuron::compiler
