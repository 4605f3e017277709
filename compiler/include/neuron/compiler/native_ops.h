// The IR operators the simulated NeuronCore runs natively, one row each
// with its engine, its limits and its lowering (the function that turns a
// node of it into device steps, compiler/src/op_lowerings.h): the lowering
// dispatches through this table and refuses every other op, and
// docs/operators.md is generated from it (`neuron-op-table`, checked by a
// test), so the three cannot drift apart. The device's own operations are
// runtime/device/device_ops.h's.
//
//   for (const NativeOp& op : NativeOps()) std::cout << op.name;
//   IsNativeOp("aten.bmm")  // true
//   FindNativeOp("aten.bmm")->lower(cx, call)
#pragma once

#include <string>
#include <vector>

namespace neuron::compiler {

class LoweringContext;  // compiler/src/lowering_context.h
struct OpCall;          // compiler/src/op_lowerings.h
using LowerFn = void (*)(LoweringContext& cx, const OpCall& call);

struct NativeOp {
  const char* name;    // the IR op, e.g. "aten.addmm"
  const char* engine;  // where it runs: "tensor", "vector", "scalar", "gpsimd"
  const char* limits;  // what the device accepts ("" when anything the op takes)
  LowerFn lower;       // its lowering
};

const std::vector<NativeOp>& NativeOps();
// The row of IR op `name`; null when the device does not run it.
const NativeOp* FindNativeOp(const std::string& name);
bool IsNativeOp(const std::string& name);

}  // namespace neuron::compiler
