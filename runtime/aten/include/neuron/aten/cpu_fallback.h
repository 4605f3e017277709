// How the "neuron" device runs ATen operators: on the CPU's kernels, over
// the same memory. A neuron tensor's memory is host memory, so an operator
// runs as its CPU kernel on CPU views of its neuron arguments (no copy);
// results that alias an argument come back as views of that argument, new
// results are adopted as device memory (no copy), and generators, device
// arguments and in-place resizes are translated. Every run is costed by the
// device model (runtime::EagerCost) on the rank's simulated compute clock
// and recorded in the OpLog.
//
// Usage (registration.cc):
//   m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
//   RunOnCpu(other_op, InfoOf(other_op), stack);   // an op run as another's CPU kernel
//
// Errors: an operator without a CPU kernel raises NotImplementedError
// naming it and saying how to run it on the CPU; a neuron tensor beside a
// CPU tensor of one or more dimensions (or on another neuron device) raises
// "Expected all tensors to be on the same device".
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "neuron/aten/op_info.h"

namespace neuron::aten {

void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Runs `target`'s CPU kernel on the arguments on `stack` (laid out as
// `target`'s schema), costed and recorded as `info`.
void RunOnCpu(const c10::OperatorHandle& target, const OpInfo& info,
              torch::jit::Stack* stack);

// What plain eager charges for `op` (runtime::EagerCost over the device's
// CostModel).
runtime::SimDuration EagerCostOf(const runtime::EagerOp& op);

// Charges one eager operation on `device` to the rank's compute clock and
// the OpLog.
void Charge(const OpInfo& info, const runtime::EagerOp& op, double wall_us,
            c10::DeviceIndex device);

}  // namespace neuron::aten
