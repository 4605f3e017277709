// Elementwise IR ops on the vector and scalar engines: arithmetic (with a
// tensor or a number), the activations and their gradients, comparisons,
// where, masked_fill, clamp and hardtanh. A second operand may repeat when it is a suffix
// of the result's shape (a bias); other broadcasts are strided copies.
#include <map>
#include <string>

#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {
namespace {

// alpha (add, sub) is 1 on the device.
void CheckAlphaOne(const OpCall& call) {
  if (const auto* alpha = Attr(call.node, "alpha")) {
    const double a = Number(*alpha);
    NEURON_CHECK(a == 1.0, call.where, ": alpha ", a,
                 " is not supported on the device (only 1)");
  }
}

// The IR op without its ".Scalar" overload suffix.
std::string BaseOp(const std::string& op) { return op.substr(0, op.find(".Scalar")); }

// Whether gelu's `approximate` attribute says "tanh" (else the erf form).
bool TanhGelu(const proto::Node& n) {
  const auto* approximate = Attr(n, "approximate");
  return approximate != nullptr && approximate->s() == "tanh";
}

// The first operand at the result's shape; the second may repeat.
void TwoOperands(LoweringContext& cx, const OpCall& call, rp::Op op,
                 const proto::Value& out) {
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(rp::VECTOR, op,
                 {cx.Broadcast(call.in[0], out, false, call.where, call.source),
                  cx.Broadcast(call.in[1], out, true, call.where, call.source)},
                 out.name(), call.source);
}

bool IsFloat(const std::string& dtype) {
  return dtype == "f32" || dtype == "bf16" || dtype == "f16";
}

// The vector and scalar engines compute floating point: an op on integer or
// bool operands runs elsewhere (the caller's fallback). Checks the inputs
// from `first` on.
void CheckFloatInputs(const LoweringContext& cx, const OpCall& call, std::size_t first = 0) {
  for (std::size_t k = first; k < call.in.size(); ++k) {
    const std::string& dtype = cx.TypeOf(call.in[k]).dtype();
    NEURON_CHECK(IsFloat(dtype), call.where, ": is not supported on the device (a ", dtype,
                 " operand; the engines compute f32, bf16 or f16)");
  }
}

// The one output of an op that computes in floating point, its inputs
// checked as above.
const proto::Value& FloatOutput(const LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = SingleOutput(call);
  const std::string& dtype = out.type().dtype();
  NEURON_CHECK(IsFloat(dtype), call.where, ": is not supported on the device (a ", dtype,
               " result; the engines compute f32, bf16 or f16)");
  CheckFloatInputs(cx, call);
  return out;
}

}  // namespace

const proto::Value& SingleOutput(const OpCall& call) {
  NEURON_CHECK(call.node.outputs_size() == 1, call.where,
               ": is not supported on the device (", call.node.outputs_size(),
               " outputs)");
  return call.node.outputs(0);
}

void LowerArithmetic(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = FloatOutput(cx, call);
  const std::string base = BaseOp(call.node.op());
  const auto* other = Attr(call.node, "other");
  CheckAlphaOne(call);
  const bool scalar_overload = base != call.node.op();  // aten.add.Scalar, ...
  if (other == nullptr || call.in.size() != 1) {
    NEURON_CHECK(!scalar_overload, call.where, ": is not supported on the device (",
                 call.in.size(), " tensor inputs)");
    NEURON_CHECK(call.in.size() == 2, call.where,
                 ": takes two inputs, or one and a number");
    static const std::map<std::string, rp::Op> kOps = {{"aten.add", rp::OP_ADD},
                                                       {"aten.sub", rp::OP_SUB},
                                                       {"aten.mul", rp::OP_MUL},
                                                       {"aten.div", rp::OP_DIV}};
    TwoOperands(cx, call, kOps.at(base), out);
    return;
  }
  // A tensor and a number: scale or add_scalar.
  const double v = Number(*other);
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  const bool scale = base == "aten.div" || base == "aten.mul";
  cx.Elementwise(rp::VECTOR, scale ? rp::OP_SCALE : rp::OP_ADD_SCALAR, call.in,
                 out.name(), call.source);
  cx.LastInstruction().set_scalar(base == "aten.div"   ? 1.0 / v
                                  : base == "aten.sub" ? -v
                                                       : v);
}

void LowerBinary(LoweringContext& cx, const OpCall& call) {
  static const std::map<std::string, rp::Op> kOps = {
      {"aten.maximum", rp::OP_MAX},
      {"aten.minimum", rp::OP_MIN},
      {"aten.tanh_backward", rp::OP_TANH_BACKWARD},
      {"aten.sigmoid_backward", rp::OP_SIGMOID_BACKWARD}};
  const proto::Value& out = FloatOutput(cx, call);
  NEURON_CHECK(call.in.size() == 2, call.where, ": takes two inputs");
  TwoOperands(cx, call, kOps.at(call.node.op()), out);
}

void LowerUnary(LoweringContext& cx, const OpCall& call) {
  static const std::map<std::string, std::pair<rp::EngineKind, rp::Op>> kOps = {
      {"aten.relu", {rp::VECTOR, rp::OP_RELU}},
      {"aten.neg", {rp::VECTOR, rp::OP_NEG}},
      {"aten.abs", {rp::VECTOR, rp::OP_ABS}},
      {"aten.sgn", {rp::VECTOR, rp::OP_SIGN}},
      {"aten.sign", {rp::VECTOR, rp::OP_SIGN}},
      {"aten.exp", {rp::SCALAR, rp::OP_EXP}},
      {"aten.sqrt", {rp::SCALAR, rp::OP_SQRT}},
      {"aten.rsqrt", {rp::SCALAR, rp::OP_RSQRT}},
      {"aten.tanh", {rp::SCALAR, rp::OP_TANH}},
      {"aten.sigmoid", {rp::SCALAR, rp::OP_SIGMOID}},
      {"aten.gelu", {rp::SCALAR, rp::OP_GELU}}};
  const proto::Value& out = FloatOutput(cx, call);
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one input");
  auto [engine, op] = kOps.at(call.node.op());
  if (op == rp::OP_GELU && !TanhGelu(call.node)) op = rp::OP_GELU_EXACT;
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(engine, op, call.in, out.name(), call.source);
}

void LowerCompare(LoweringContext& cx, const OpCall& call) {  // -> bool
  static const std::map<std::string, rp::Op> kOps = {
      {"aten.eq", rp::OP_COMPARE_EQ}, {"aten.ne", rp::OP_COMPARE_NE},
      {"aten.lt", rp::OP_COMPARE_LT}, {"aten.le", rp::OP_COMPARE_LE},
      {"aten.gt", rp::OP_COMPARE_GT}, {"aten.ge", rp::OP_COMPARE_GE}};
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 1 || call.in.size() == 2, call.where,
               ": compares a tensor with a tensor or a number");
  CheckFloatInputs(cx, call);
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  std::vector<std::string> operands = {
      cx.Broadcast(call.in[0], out, false, call.where, call.source)};
  if (call.in.size() == 2) {
    operands.push_back(cx.Broadcast(call.in[1], out, true, call.where, call.source));
  }
  cx.Elementwise(rp::VECTOR, kOps.at(BaseOp(call.node.op())), operands, out.name(),
                 call.source);
  if (call.in.size() == 1) {
    const auto* other = Attr(call.node, "other");
    NEURON_CHECK(other != nullptr, call.where, ": compares with a tensor or a number");
    cx.LastInstruction().set_scalar(Number(*other));
  }
}

void LowerWhere(LoweringContext& cx, const OpCall& call) {  // (cond, a, b)
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 3, call.where, ": takes a condition and two tensors");
  CheckFloatInputs(cx, call, 1);
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(rp::VECTOR, rp::OP_WHERE,
                 {cx.Broadcast(call.in[0], out, false, call.where, call.source),
                  cx.Broadcast(call.in[1], out, false, call.where, call.source),
                  cx.Broadcast(call.in[2], out, true, call.where, call.source)},
                 out.name(), call.source);
}

void LowerMaskedFill(LoweringContext& cx, const OpCall& call) {  // (x, mask) {value}
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 2, call.where, ": takes a tensor and a mask");
  NEURON_CHECK(IsFloat(cx.TypeOf(call.in[0]).dtype()), call.where,
               ": is not supported on the device (a ", cx.TypeOf(call.in[0]).dtype(),
               " tensor; the engines compute f32, bf16 or f16)");
  TwoOperands(cx, call, rp::OP_MASKED_FILL, out);
  cx.LastInstruction().set_scalar(AttrNumber(call.node, "value", 0.0));
}

void LowerThresholdBackward(LoweringContext& cx, const OpCall& call) {  // (grad, input)
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 2, call.where, ": takes two tensor inputs");
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(rp::VECTOR, rp::OP_THRESHOLD_BACKWARD, call.in, out.name(), call.source);
  cx.LastInstruction().set_scalar(AttrNumber(call.node, "threshold", 0.0));
}

void LowerGeluBackward(LoweringContext& cx, const OpCall& call) {  // (grad, input)
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 2, call.where, ": takes two tensor inputs");
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(rp::VECTOR,
                 TanhGelu(call.node) ? rp::OP_GELU_BACKWARD : rp::OP_GELU_EXACT_BACKWARD,
                 call.in, out.name(), call.source);
}

namespace {

// A scratch value of `like`'s type, named after it.
std::string Scratch(LoweringContext& cx, const proto::Value& like, const char* suffix,
                    const std::string& where) {
  proto::Value v = like;
  v.set_name(like.name() + suffix);
  cx.AddSlot(v.name(), v, rp::SBUF, where);
  return v.name();
}

// hardtanh_backward(grad, x, lo, hi) = grad where lo < x < hi, else 0: grad
// where x > lo, then that where -x > -hi.
void LowerHardtanhBackward(LoweringContext& cx, const OpCall& call,
                           const proto::Value& out) {
  NEURON_CHECK(call.in.size() == 2, call.where, ": takes the gradient and the input");
  const double lo = AttrNumber(call.node, "min_val", -1.0);
  const double hi = AttrNumber(call.node, "max_val", 1.0);
  const std::string above = Scratch(cx, out, ".above", call.where);
  const std::string negated = Scratch(cx, out, ".neg", call.where);
  cx.Elementwise(rp::VECTOR, rp::OP_THRESHOLD_BACKWARD, call.in, above, call.source);
  cx.LastInstruction().set_scalar(lo);
  cx.Elementwise(rp::VECTOR, rp::OP_NEG, {call.in[1]}, negated, call.source);
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.Elementwise(rp::VECTOR, rp::OP_THRESHOLD_BACKWARD, {above, negated}, out.name(),
                 call.source);
  cx.LastInstruction().set_scalar(-hi);
}

}  // namespace

// clamp(x, min, max), clamp_min, clamp_max and hardtanh(x, min_val,
// max_val): a clamp_min then a clamp_max (a bound clamp leaves out is
// skipped), which fusion joins into one pass; hardtanh_backward as above.
void LowerClamp(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = FloatOutput(cx, call);
  const std::string& op = call.node.op();
  if (op == "aten.hardtanh_backward") return LowerHardtanhBackward(cx, call, out);
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one tensor and number bounds");
  std::vector<std::pair<rp::Op, double>> steps;
  if (op == "aten.hardtanh") {
    steps = {{rp::OP_CLAMP_MIN, AttrNumber(call.node, "min_val", -1.0)},
             {rp::OP_CLAMP_MAX, AttrNumber(call.node, "max_val", 1.0)}};
  } else {
    const proto::Attribute* lo =
        op == "aten.clamp_max" ? nullptr : Attr(call.node, "min");
    const proto::Attribute* hi =
        op == "aten.clamp_min" ? nullptr : Attr(call.node, "max");
    if (lo != nullptr) steps.push_back({rp::OP_CLAMP_MIN, Number(*lo)});
    if (hi != nullptr) steps.push_back({rp::OP_CLAMP_MAX, Number(*hi)});
  }
  NEURON_CHECK(!steps.empty(), call.where, ": clamp without a bound (torch refuses it)");
  std::string from = call.in[0];
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const bool last = k + 1 == steps.size();
    const std::string to = last ? out.name() : Scratch(cx, out, ".min", call.where);
    if (last) cx.AddSlot(out.name(), out, rp::SBUF, call.where);
    cx.Elementwise(rp::VECTOR, steps[k].first, {from}, to, call.source);
    cx.LastInstruction().set_scalar(steps[k].second);
    from = to;
  }
}

}  // namespace neuron::compiler
