// What the simulated NeuronCore does with each ATen operator it sees: one
// table, read by eager "neuron" (runtime/aten/src/op_info.cc) and by the
// compiler (its lowering errors and docs/operators.md), in the categories of
// TorchNeuron's API compatibility table (docs/operators.md):
//
//   native        runs on the device: its kernel family (EagerKind: matmul on
//                 the tensor engine, vector, scalar, copy) prices it
//   CPU fallback  runs the CPU's kernel: its inputs copied to the host, the
//                 kernel, its outputs copied back, a synchronisation
//                 (EagerKind::kFallback, priced by eager_cost.h)
//   unsupported   refused: an error naming the op and Neuron's reason
//   host-only     metadata (views, sizes, allocation): no device work
//
// Ops are keyed by their base name: no namespace, overload or trailing
// in-place underscore ("aten::add_.Tensor" -> "add"). An op the table does
// not list is a CPU fallback, as TorchNeuron runs an op it has no Neuron
// kernel for. Types the NeuronCore lacks are not rows: see FallbackForTypes.
//
// Usage:
//   const OpSupport& row = SupportOf("sort");   // kCpuFallback
//   if (row.support == Support::kUnsupported) throw ... row.note;
//   for (const OpSupport& r : OpSupportTable()) ...   // docs/operators.md
#pragma once

#include <string_view>
#include <vector>

#include "neuron/runtime/device/eager_cost.h"

namespace neuron::runtime {

enum class Support { kNative, kCpuFallback, kUnsupported, kHostOnly };
// "native", "CPU fallback", "unsupported", "host-only".
const char* Name(Support support);

struct OpSupport {
  const char* op;   // base name, e.g. "addmm"
  Support support;
  EagerKind kind;   // kNative: its kernel family; kCpuFallback: kFallback;
                    // kHostOnly: kView; kUnsupported: kFallback (never run)
  const char* note; // kNative: the engine; otherwise why (Neuron's reason
                    // for kUnsupported), shown in errors and docs
};

// Every listed row, in the table's order (native by family, then CPU
// fallbacks, unsupported, host-only). Base names are unique.
const std::vector<OpSupport>& OpSupportTable();
// The row of `base`, or the default CPU-fallback row ("op" empty) for an op
// the table does not list. A hashed lookup: callers cache it per operator.
const OpSupport& SupportOf(std::string_view base);

// Element types the NeuronCore's engines lack (docs/device.md, "Types the
// NeuronCore lacks"), by their PyTorch names.
enum class TypeSupport { kNative, kCpuFallback, kUnsupported };
// float64 ("Double"): a CPU fallback; complex ("ComplexFloat", ...) and the
// FNUZ float8 variants ("Float8_e4m3fnuz", "Float8_e5m2fnuz"): unsupported;
// every other type: native.
TypeSupport SupportOfType(std::string_view scalar_type_name);
// Neuron's message for a type it refuses: complex types' NCC_EVRF004, the
// FNUZ float8 types' NCC_EVRF005; "" for the others.
const char* TypeUnsupportedReason(std::string_view scalar_type_name);

}  // namespace neuron::runtime
