// Tensors across the torch boundary: dense CPU torch tensors to the
// runtime's HostTensors (executor inputs) and back, for the frontends that
// see torch (the Python bindings, the TorchScript frontend and its users).
//
//   runtime::HostTensor h = ToHost(torch::randn({4, 8}));
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

// A contiguous copy of a dense CPU tensor; InvalidUsage otherwise.
runtime::HostTensor ToHost(const at::Tensor& tensor);
at::Tensor FromHost(const runtime::HostTensor& host);

}  // namespace neuron::compiler
