// Custom kernels in a plan (proto::OP_CUSTOM_KERNEL): kernels the compiler
// does not see into (torchneuron.nki kernels, registered by the Python
// bindings), run by the executor through a callback registered under the
// instruction's `kernel` key, and priced by the kernel's own schedule (the
// instruction's kernel_us on its kernel_engines, plan_timing.h).
//
//   RegisterCustomKernel("nki::add(...)@1f2e", [](const auto& in, const auto& out) {
//     ... read in[k].data, write every byte of out[k].data ...
//   });
//   // a plan's OP_CUSTOM_KERNEL instruction with kernel = that key now runs it
//
// A key is registered once per process and kept (a later registration of
// the same key replaces it); the callback may run on any thread that runs
// a plan, one call at a time per key's caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "neuron/runtime/executable.pb.h"

namespace neuron::runtime {

// One tensor a custom kernel reads or writes: its bytes in the plan's
// memory, laid out contiguously as `shape` of `dtype`.
struct KernelOperand {
  proto::ElementType dtype = proto::F32;
  std::vector<std::int64_t> shape;
  std::uint8_t* data = nullptr;
  std::size_t bytes = 0;
};

// Reads `inputs`, writes every byte of `outputs`; throws (InvalidUsage) on
// failure, which fails the plan's run.
using CustomKernel = std::function<void(const std::vector<KernelOperand>& inputs,
                                        const std::vector<KernelOperand>& outputs)>;

void RegisterCustomKernel(const std::string& key, CustomKernel kernel);
bool HasCustomKernel(const std::string& key);

// Runs the kernel registered under `key`; InvalidUsage naming `what` and
// the key when none is.
void RunCustomKernel(const std::string& key, const std::vector<KernelOperand>& inputs,
                     const std::vector<KernelOperand>& outputs, const std::string& what);

// The checks ValidateExecutable makes of an OP_CUSTOM_KERNEL instruction:
// a key, a duration >= 0, its engine among kernel_engines, one busy time
// per engine within the duration. InvalidUsage naming `what` otherwise.
void CheckCustomKernelInstruction(const proto::Instruction& i, const std::string& what);

}  // namespace neuron::runtime
