// Matmuls on the tensor engine: mm, addmm (the bias added as the result
// leaves PSUM) and bmm (LoweringContext::Matmul tiles what PSUM cannot hold).
#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

void LowerMatmul(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = SingleOutput(call);
  const std::string& op = call.node.op();
  const auto& in = call.in;
  if (op == "aten.bmm") {  // [B,M,K] x [B,K,N]
    NEURON_CHECK(in.size() == 2, call.where, ": takes 2 inputs");
    const auto& a = cx.TypeOf(in[0]);
    const auto& b = cx.TypeOf(in[1]);
    NEURON_CHECK(a.shape_size() == 3 && b.shape_size() == 3 && a.shape(0) == b.shape(0) &&
                     a.shape(2) == b.shape(1),
                 call.where, ": needs [B,M,K] x [B,K,N] operands");
    cx.Matmul(in[0], in[1], out, a.shape(1), a.shape(2), b.shape(2), a.shape(0),
              call.where, call.source);
    return;
  }
  // addmm(bias, a, b) = a x b + bias: the matmul, then a vector add.
  const bool addmm = op == "aten.addmm";
  NEURON_CHECK(in.size() == (addmm ? 3u : 2u), call.where, ": takes ", addmm ? 3 : 2,
               " inputs");
  if (addmm) {
    for (const char* key : {"alpha", "beta"}) {
      if (const auto* a = Attr(call.node, key)) {
        const double v = Number(*a);
        NEURON_CHECK(v == 1.0, call.where, ": ", key, " ", v,
                     " is not supported (only 1)");
      }
    }
  }
  const std::string lhs = in[addmm ? 1 : 0], rhs = in[addmm ? 2 : 1];
  const auto& a = cx.TypeOf(lhs);
  const auto& b = cx.TypeOf(rhs);
  NEURON_CHECK(a.shape_size() == 2 && b.shape_size() == 2 && a.shape(1) == b.shape(0),
               call.where, ": needs [M,K] x [K,N] operands");
  cx.Matmul(lhs, rhs, out, a.shape(0), a.shape(1), b.shape(1), 0, call.where, call.source,
            addmm ? in[0] : std::string());
}

}  // namespace neuron::compiler
