// What the "neuron" device knows about an ATen operator, computed once per
// operator: its row of the device's support table (runtime/device/
// op_support.h: native, CPU fallback, unsupported, host-only) and how it is
// costed (runtime::EagerKind, the row's), whether a
// CPU kernel can run it, and which of its arguments are generators, device
// choices or written in place.
//
// Usage:
//   const OpInfo& info = InfoOf(op);          // op: c10::OperatorHandle
//   if (!info.cpu_kernel) ...                  // no kernel to fall back to
//   runtime::EagerOp cost = Describe(info, inputs, outputs);
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "neuron/runtime/device/eager_cost.h"
#include "neuron/runtime/device/op_support.h"

namespace neuron::aten {

struct OpInfo {
  std::string name;                 // "aten::add.Tensor"
  std::string base;                 // "add" (no namespace, overload or trailing _)
  runtime::Support support = runtime::Support::kCpuFallback;
  runtime::EagerKind kind = runtime::EagerKind::kFallback;
  const char* reason = "";          // the table's note: why it falls back or is refused
  bool cpu_kernel = false;          // the CPU can run it
  bool cpu_arguments_ok = false;    // takes CPU tensors beside device ones (indices)
  std::vector<bool> generator;      // per argument: a Generator? argument
  // Per argument: a one-element CPU tensor is a number here, as on CUDA
  // (the fused optimizers' lr: CUDA's kernels read a CPU lr with item()).
  std::vector<bool> cpu_scalar;
  std::vector<bool> written;        // per argument: mutated (in place, out=)
  bool writes = false;              // any argument is
  int scan_dim_argument = -1;       // a scan (cumsum, ...): its `dim` argument's index
  const void* schema = nullptr;     // the operator's schema (its identity)
};

const OpInfo& InfoOf(const c10::OperatorHandle& op);

// How the device treats tensors of `type` (float64: CPU fallback; complex:
// unsupported), from the support table, cached per type.
runtime::TypeSupport TypeSupportOf(at::ScalarType type);
// Refuses a tensor of a type the device does not support in `info`'s op
// (host-only ops take any), naming the op, the type and Neuron's reason.
void CheckType(const OpInfo& info, const at::Tensor& t);

// The cost description of one run: `inputs` and `outputs` are the CPU
// views of the op's tensor arguments and results. A native op with a
// tensor of a type the core lacks (float64) is a CPU fallback; a result of
// an unsupported type (complex) is refused (CheckType).
runtime::EagerOp Describe(const OpInfo& info, c10::ArrayRef<at::Tensor> inputs,
                          c10::ArrayRef<at::Tensor> outputs);
// A scan's figures in `op` (scan_lines, scan_length): `input` scanned along
// `dim` (negative from the end).
void DescribeScan(const at::Tensor& input, std::int64_t dim, runtime::EagerOp& op);

}  // namespace neuron::aten
