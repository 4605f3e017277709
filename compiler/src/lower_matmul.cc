// Matmuls on the tensor engine: mm, addmm (the bias added as the result
// leaves PSUM) and bmm (LoweringContext::Matmul tiles what PSUM cannot hold).
// An operand whose node attribute transpose_lhs / transpose_rhs is 1 (set by
// FoldTransposesIntoMatmuls) is stored transposed and read in place.
#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

namespace {

// Sizes of the product of `a` and `b` (stored shapes; the last two dims are
// the matrix, a leading one the batch), per the node's transpose attributes.
MatmulDims DimsOf(const OpCall& call, const proto::TensorType& a,
                  const proto::TensorType& b, bool batched) {
  MatmulDims d;
  d.transpose_lhs = AttrInt(call.node, "transpose_lhs", 0) != 0;
  d.transpose_rhs = AttrInt(call.node, "transpose_rhs", 0) != 0;
  const int rank = batched ? 3 : 2;
  NEURON_CHECK(a.shape_size() == rank && b.shape_size() == rank, call.where, ": needs ",
               batched ? "[B,M,K] x [B,K,N]" : "[M,K] x [K,N]", " operands");
  const int r = rank - 2, c = rank - 1;  // the matrix's row and column dims
  d.m = d.transpose_lhs ? a.shape(c) : a.shape(r);
  d.k = d.transpose_lhs ? a.shape(r) : a.shape(c);
  const std::int64_t kb = d.transpose_rhs ? b.shape(c) : b.shape(r);
  d.n = d.transpose_rhs ? b.shape(r) : b.shape(c);
  NEURON_CHECK(d.k == kb && (!batched || a.shape(0) == b.shape(0)), call.where,
               ": needs ", batched ? "[B,M,K] x [B,K,N]" : "[M,K] x [K,N]",
               " operands, got [", Join(Shape(a)), "]",
               d.transpose_lhs ? " transposed" : "", " x [", Join(Shape(b)), "]",
               d.transpose_rhs ? " transposed" : "");
  if (batched) d.batch = a.shape(0);
  return d;
}

}  // namespace

void LowerMatmul(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = SingleOutput(call);
  const std::string& op = call.node.op();
  const auto& in = call.in;
  if (op == "aten.bmm") {  // [B,M,K] x [B,K,N]
    NEURON_CHECK(in.size() == 2, call.where, ": takes 2 inputs");
    cx.Matmul(in[0], in[1], out, DimsOf(call, cx.TypeOf(in[0]), cx.TypeOf(in[1]), true),
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
  cx.Matmul(lhs, rhs, out, DimsOf(call, cx.TypeOf(lhs), cx.TypeOf(rhs), false),
            call.where, call.source, addmm ? in[0] : std::string());
}

}  // namespace neuron::compiler
