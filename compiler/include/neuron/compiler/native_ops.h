// The operators the simulated NeuronCore runs natively: the lowering
// (lower.h) refuses every other op, and docs/operators.md is generated from
// this table (`neuron-op-table`, checked by a test), so the two cannot
// drift apart.
//
//   for (const NativeOp& op : NativeOps()) std::cout << op.name;
//   IsNativeOp("aten.bmm")  // true
#pragma once

#include <string>
#include <vector>

namespace neuron::compiler {

struct NativeOp {
  const char* name;    // the IR op, e.g. "aten.addmm"
  const char* engine;  // where it runs: "tensor", "vector", "scalar", "gpsimd"
  const char* limits;  // what the device accepts ("" when anything the op takes)
};

const std::vector<NativeOp>& NativeOps();
bool IsNativeOp(const std::string& name);

}  // namespace neuron::compiler
