// Scans along one dimension: cumsum (its gradient is flip, cumsum, flip)
// and flip. Each step views its input as [outer, len, inner] around the
// dimension (the instruction's m, n, k), so no transposing copy is needed.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

namespace {

// One scan step of `op` along dimension d of `shape`: reads `from`, writes
// `to` (a slot already added), over its elements.
void ScanStep(LoweringContext& cx, rp::Op op, const std::vector<std::int64_t>& shape,
              std::size_t d, const std::string& from, const std::string& to,
              const std::string& source) {
  std::int64_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < d; ++k) outer *= shape[k];
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  const std::int64_t len = shape.empty() ? 1 : shape[d];
  rp::Instruction& i = cx.AddStep(rp::VECTOR, op, {from}, {to}, source);
  i.set_m(outer);
  i.set_n(len);
  i.set_k(inner);
}

void CheckSameShape(const proto::TensorType& in, const proto::TensorType& out,
                    const std::string& where) {
  NEURON_CHECK(Shape(in) == Shape(out), where, ": the result is [", Join(Shape(out)),
               "], the input [", Join(Shape(in)), "]");
}

}  // namespace

// cumsum(x, dim) of a float tensor, the result of x's dtype (a dtype
// argument that changes it is refused): the running sum along dim in order,
// accumulated as ATen's CPU kernel does (kernels.h), so equal to eager.
void LowerCumsum(LoweringContext& cx, const OpCall& call) {
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one tensor input");
  const proto::Value& out = SingleOutput(call);
  const proto::TensorType& t = cx.TypeOf(call.in[0]);
  const std::string& dtype = t.dtype();
  NEURON_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16", call.where,
               ": is not supported on the device (a ", dtype, " cumsum)");
  NEURON_CHECK(out.type().dtype() == dtype, call.where, ": a ", dtype,
               " input summed into ", out.type().dtype(),
               " is not supported on the device (the sum keeps the input's dtype)");
  CheckSameShape(t, out.type(), call.where);
  const auto shape = Shape(t);
  const std::int64_t dim = AttrInt(call.node, "dim", 0);
  const auto d = static_cast<std::size_t>(
      shape.empty() ? 0 : Dim(dim, shape.size(), call.where));
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  ScanStep(cx, rp::OP_CUMSUM, shape, d, call.in[0], out.name(), call.source);
}

// flip(x, dims), any dtype, bitwise: one reverse step per flipped
// dimension (none flipped: one step along a dimension of 1, a copy).
void LowerFlip(LoweringContext& cx, const OpCall& call) {
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one tensor input");
  const proto::Value& out = SingleOutput(call);
  const proto::TensorType& t = cx.TypeOf(call.in[0]);
  NEURON_CHECK(out.type().dtype() == t.dtype(), call.where, ": changes the dtype");
  CheckSameShape(t, out.type(), call.where);
  auto shape = Shape(t);
  std::vector<std::size_t> dims;
  for (std::int64_t d : AttrInts(call.node, "dims")) {
    const auto k = static_cast<std::size_t>(Dim(d, shape.size(), call.where));
    NEURON_CHECK(std::find(dims.begin(), dims.end(), k) == dims.end(), call.where,
                 ": dim ", d, " appears twice in dims");
    if (shape[k] > 1) dims.push_back(k);  // reversing a dimension of 1 is no change
  }
  if (dims.empty()) {  // a copy, as a reverse of [elements, 1, 1]
    shape = {Elements(t)};
    shape.push_back(1);
    dims.push_back(1);
  }
  std::string from = call.in[0];
  for (std::size_t s = 0; s < dims.size(); ++s) {
    std::string to = out.name();
    if (s + 1 < dims.size()) {  // an intermediate, flipped along the first s dims
      proto::Value step = out;
      step.set_name(out.name() + ".flip" + std::to_string(s));
      to = step.name();
      cx.AddSlot(to, step, rp::SBUF, call.where);
    } else {
      cx.AddSlot(to, out, rp::SBUF, call.where);
    }
    ScanStep(cx, rp::OP_REVERSE, shape, dims[s], from, to, call.source);
    from = to;
  }
}

}  // namespace neuron::compiler
