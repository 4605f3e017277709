// Row-wise IR ops over the last dimension (softmax and log-softmax with
// their gradients, layer norm, nll loss) and reductions (sum, mean).
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/device/device_ops.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

// _softmax, _log_softmax and their _backward_data, over the last
// dimension, on the scalar engine.
void LowerRowwise(LoweringContext& cx, const OpCall& call) {
  static const std::map<std::string, rp::Op> kOps = {
      {"aten._softmax", rp::OP_SOFTMAX_ROWS},
      {"aten._log_softmax", rp::OP_LOG_SOFTMAX_ROWS},
      {"aten._softmax_backward_data", rp::OP_SOFTMAX_BACKWARD_ROWS},
      {"aten._log_softmax_backward_data", rp::OP_LOG_SOFTMAX_BACKWARD_ROWS}};
  const proto::Value& out = SingleOutput(call);
  const rp::Op op = kOps.at(call.node.op());
  const std::size_t inputs = static_cast<std::size_t>(runtime::FindDeviceOp(op)->inputs);
  NEURON_CHECK(call.in.size() == inputs, call.where, ": takes ", inputs,
               " tensor input(s)");
  const auto& t = cx.TypeOf(call.in[0]);
  NEURON_CHECK(t.shape_size() >= 1, call.where, ": needs at least one dimension");
  const auto* dim = Attr(call.node, "dim");
  const std::int64_t d = dim == nullptr ? -1 : dim->i();
  NEURON_CHECK(d == -1 || d == t.shape_size() - 1, call.where,
               ": supported over the last dimension only, not dim ", d);
  for (const auto& name : call.in) {
    NEURON_CHECK(Elements(cx.TypeOf(name)) == Elements(out.type()), call.where,
                 ": operands and result must have the same elements");
  }
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  const std::int64_t cols = t.shape(t.shape_size() - 1);
  // Three passes over each row (max, exponentials and sum, normalise): the
  // op's cost in device_ops.h.
  cx.Elementwise(rp::SCALAR, op, call.in, out.name(), call.source);
  cx.LastInstruction().set_m(cols == 0 ? 0 : Elements(out.type()) / cols);
  cx.LastInstruction().set_n(cols);
}

// native_layer_norm (x, weight, bias -> y, mean, rstd) and its backward
// (grad, x, mean, rstd, weight, bias -> grad x, grad weight, grad bias),
// normalising over the last dimension, with weight and bias.
void LowerLayerNorm(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  const bool forward = n.op() == "aten.native_layer_norm";
  NEURON_CHECK(
      in.size() == (forward ? 3u : 6u) && n.outputs_size() == 3, where,
      ": supported with weight and bias (elementwise_affine) and all three outputs");
  const auto& x = cx.TypeOf(in[forward ? 0 : 1]);
  auto it = n.attrs().find("normalized_shape");
  NEURON_CHECK(it != n.attrs().end() && it->second.ints().values_size() == 1 &&
                   x.shape_size() >= 1 &&
                   it->second.ints().values(0) == x.shape(x.shape_size() - 1),
               where, ": supported over the last dimension only");
  // output_mask is not needed: all three gradients are computed (the
  // graph leaves the unwanted ones unused).
  const std::int64_t cols = x.shape(x.shape_size() - 1);
  const std::vector<std::string> outs = cx.AddOutputSlots(n, where);
  // Over the elements of x (the first output has its shape), in passes
  // over each row (the op's cost, device_ops.h: 3 forward, 5 backward).
  rp::Instruction& i = cx.AddStep(
      rp::VECTOR, forward ? rp::OP_LAYER_NORM_ROWS : rp::OP_LAYER_NORM_BACKWARD_ROWS,
      forward ? in : std::vector<std::string>(in.begin(), in.begin() + 5), outs, source);
  i.set_m(cols == 0 ? 0 : Elements(x) / cols);
  i.set_n(cols);
  if (forward) i.set_scalar(AttrNumber(n, "eps", 1e-5));
}

// nll_loss_forward (log-probabilities [N, C], targets [N] -> loss, total
// weight) and nll_loss_backward (grad, log-probabilities, targets, total
// weight -> grad [N, C]); no class weights, mean or sum reduction.
void LowerNllLoss(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  const bool forward = n.op() == "aten.nll_loss_forward";
  NEURON_CHECK(in.size() == (forward ? 2u : 4u) && n.outputs_size() == (forward ? 2 : 1),
               where, ": supported without class weights");
  const std::int64_t reduction = AttrInt(n, "reduction", 1);
  NEURON_CHECK(reduction >= 0 && reduction <= 2, where, ": reduction ", reduction,
               " is none (0), mean (1) or sum (2)");
  const auto& logp = cx.TypeOf(in[forward ? 0 : 1]);
  NEURON_CHECK(logp.shape_size() == 2, where, ": supported for [N, C] inputs");
  const std::vector<std::string> outs = cx.AddOutputSlots(n, where);
  rp::Instruction& i = cx.AddStep(
      rp::VECTOR, forward ? rp::OP_NLL_LOSS_ROWS : rp::OP_NLL_LOSS_BACKWARD_ROWS,
      forward ? in : std::vector<std::string>{in[0], in[2], in[3]}, outs, source);
  i.set_m(logp.shape(0));
  i.set_n(logp.shape(1));
  i.set_k(AttrInt(n, "ignore_index", -100));
  i.set_scalar(static_cast<double>(reduction));
  i.set_elements(Elements(logp));  // over the log-probabilities, not the loss
}

// sum.dim_IntList (and mean) over any dims: the reduced dims moved to the
// front (one strided copy, unless they lead already), then a row sum
// (then scaled, for a mean).
void LowerSum(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  NEURON_CHECK(in.size() == 1, where, ": takes one input");
  const proto::Value& out = SingleOutput(call);
  const auto shape = Shape(cx.TypeOf(in[0]));
  std::set<std::size_t> reduced;
  const std::vector<std::int64_t> dims = AttrInts(n, "dim");
  for (auto d : dims)
    reduced.insert(static_cast<std::size_t>(Dim(d, shape.size(), where)));
  if (dims.empty()) {
    for (std::size_t d = 0; d < shape.size(); ++d) reduced.insert(d);  // sum of all
  }
  std::int64_t rows = 1, cols = 1;
  std::vector<std::int64_t> sizes, view;
  const auto strides = ContiguousStrides(shape);
  for (std::size_t d : reduced) {
    rows *= shape[d];
    sizes.push_back(shape[d]);
    view.push_back(strides[d]);
  }
  bool leading = true;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (reduced.count(d)) {
      leading = leading && d < reduced.size();
      continue;
    }
    cols *= shape[d];
    sizes.push_back(shape[d]);
    view.push_back(strides[d]);
  }
  NEURON_CHECK(Elements(out.type()) == cols, where, ": the sum has ", cols,
               " elements, the graph says ", Elements(out.type()));
  cx.AddSlot(out.name(), out, rp::SBUF, where);
  std::string from = in[0];
  if (!leading) {
    proto::Value moved = cx.ValueOf(in[0]);
    moved.set_name(out.name() + ".moved");
    from = moved.name();
    cx.AddSlot(from, moved, rp::SBUF, where);
    cx.StridedCopy(in[0], from, sizes, view, 0, source);
  }
  const bool mean = n.op().rfind("aten.mean", 0) == 0;
  std::string sum = out.name();
  if (mean) {  // the sum, then scaled by 1 / the count
    proto::Value total = out;
    total.set_name(out.name() + ".sum");
    sum = total.name();
    cx.AddSlot(sum, total, rp::SBUF, where);
  }
  cx.Elementwise(rp::VECTOR, rp::OP_SUM_ROWS, {from}, sum, source);
  cx.LastInstruction().set_m(rows);
  cx.LastInstruction().set_n(cols);
  if (mean) {
    cx.Elementwise(rp::VECTOR, rp::OP_SCALE, {sum}, out.name(), source);
    cx.LastInstruction().set_scalar(rows == 0 ? NAN : 1.0 / static_cast<double>(rows));
  }
}

}  // namespace neuron::compiler
