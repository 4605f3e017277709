// Indexing and random ops on GpSimd: embedding and its backward, arange,
// dropout and bernoulli (a counter-based hash of the run's seed).
#include <string>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

// embedding (table, indices) and embedding_dense_backward (grad,
// indices), on GpSimd; and arange.
void LowerIndexing(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  const std::string& op = n.op();
  const bool arange = op.rfind("aten.arange", 0) == 0;
  NEURON_CHECK(n.outputs_size() == 1, where, ": has one output");
  const proto::Value& out = n.outputs(0);
  cx.AddSlot(out.name(), out, rp::SBUF, where);
  if (arange) {
    const double start = AttrNumber(n, "start", 0.0), step = AttrNumber(n, "step", 1.0);
    NEURON_CHECK(step != 0, where, ": step 0");
    rp::Instruction& i = cx.AddStep(rp::GPSIMD, rp::OP_IOTA, {}, {out.name()}, source);
    i.set_scalar(start);
    i.set_step(step);
    return;
  }
  NEURON_CHECK(in.size() == 2, where, ": takes rows and indices");
  const auto& rows = cx.TypeOf(in[0]);
  const std::int64_t indices = Elements(cx.TypeOf(in[1]));
  if (op == "aten.embedding") {
    NEURON_CHECK(rows.shape_size() == 2, where, ": the table must be 2-D");
    rp::Instruction& i =
        cx.AddStep(rp::GPSIMD, rp::OP_GATHER_ROWS, in, {out.name()}, source);
    i.set_m(indices);
    i.set_k(rows.shape(0));
    i.set_n(rows.shape(1));
    return;
  }
  NEURON_CHECK(AttrNumber(n, "scale_grad_by_freq", 0) == 0, where,
               ": scale_grad_by_freq is not supported on the device");
  const std::int64_t cols =
      rows.shape_size() == 0 ? 0 : rows.shape(rows.shape_size() - 1);
  const auto weights = static_cast<std::int64_t>(AttrNumber(n, "num_weights", 0));
  NEURON_CHECK(Elements(out.type()) == weights * cols, where, ": the gradient of ",
               weights, " rows of ", cols);
  rp::Instruction& i =
      cx.AddStep(rp::GPSIMD, rp::OP_SCATTER_ADD_ROWS, in, {out.name()}, source);
  i.set_m(indices);
  i.set_k(weights);
  i.set_n(cols);
  i.set_scalar(AttrNumber(n, "padding_idx", -1));
}

// native_dropout (x, seed) {p, train, stream} -> (y, mask): the mask from
// a counter-based hash of (seed, stream, element), on GpSimd; and
// native_dropout_backward (grad, mask) {scale}.
void LowerDropout(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  const std::string& op = n.op();
  const bool bernoulli = op == "aten.bernoulli_.float" || op == "aten.bernoulli.p";
  const std::vector<std::string> writes = cx.AddOutputSlots(n, where);
  const double p = AttrNumber(n, "p", 0.5);
  const auto stream = static_cast<std::int64_t>(AttrNumber(n, "stream", 0));
  if (bernoulli) {  // (shape source, seed) {p, stream}: 1 with probability p, else 0
    NEURON_CHECK(in.size() == 2 && n.outputs_size() == 1, where,
                 ": takes a tensor and the run's seed");
    NEURON_CHECK(p >= 0 && p <= 1, where, ": p ", p, " must be in [0, 1]");
    rp::Instruction& i = cx.AddStep(rp::GPSIMD, rp::OP_BERNOULLI, in, writes, source);
    i.set_scalar(p);
    i.set_k(stream);
  } else if (op == "aten.native_dropout") {
    NEURON_CHECK(in.size() == 2 && n.outputs_size() == 2, where,
                 ": takes the input and the run's seed, gives the result and the mask");
    NEURON_CHECK(p >= 0 && p < 1, where, ": p ", p, " must be in [0, 1)");
    rp::Instruction& i = cx.AddStep(rp::GPSIMD, rp::OP_DROPOUT, in, writes, source);
    i.set_scalar(AttrNumber(n, "train", 1) != 0 ? p : 0.0);
    i.set_k(stream);
  } else {
    NEURON_CHECK(in.size() == 2 && n.outputs_size() == 1, where,
                 ": takes the gradient and the mask");
    cx.AddStep(rp::GPSIMD, rp::OP_MASKED_SCALE, in, writes, source)
        .set_scalar(AttrNumber(n, "scale", 1.0));
  }
}

}  // namespace neuron::compiler
