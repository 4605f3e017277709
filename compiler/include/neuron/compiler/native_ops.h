// The IR operators the simulated NeuronCore runs natively, one row each
// with its engine, its limits and its lowering (the function that turns a
// node of it into device steps, compiler/src/op_lowerings.h): the lowering
// dispatches through this table and refuses every other op, and
// docs/operators.md is generated from it (`neuron-op-table`, checked by a
// test), so the three cannot drift apart. The device's own operations are
// runtime/device/device_ops.h's. Each row's op is native (or host-only
// metadata) in the runtime's support table (runtime/device/op_support.h),
// which says what becomes of every other op; a test keeps the two agreeing.
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

// What the frontends treat alike (torchneuron/fx_ops.py): kRandom draws
// the run's random bits (a stream of its dropout seed); kSameBytes is a
// view whose result is its input's bytes as they lie (an output made by
// such views is made in Python, not stored); kLayout a view that reorders
// its input's dims.
enum class OpTrait { kNone, kRandom, kSameBytes, kLayout };
// "", "random", "same_bytes", "layout".
const char* Name(OpTrait trait);

struct NativeOp {
  const char* name;    // the IR op, e.g. "aten.addmm"
  const char* engine;  // where it runs: "tensor", "vector", "scalar", "gpsimd"
  const char* limits;  // what the device accepts ("" when anything the op takes)
  LowerFn lower;       // its lowering
  OpTrait trait = OpTrait::kNone;
};

const std::vector<NativeOp>& NativeOps();
// The row of IR op `name`; null when the device does not run it.
const NativeOp* FindNativeOp(const std::string& name);
bool IsNativeOp(const std::string& name);
// The key of IR op `name` in the runtime's support table: no namespace,
// overload or trailing in-place underscore ("aten.bernoulli_.float" ->
// "bernoulli", "aten._softmax" -> "_softmax").
std::string SupportKey(const std::string& name);
// Why the device does not run IR op `name`, from the support table:
// "CPU fallback: <why>" or "unsupported: <Neuron's reason>".
std::string NotNativeReason(const std::string& name);

}  // namespace neuron::compiler
