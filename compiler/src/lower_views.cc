// Data movement: views as aliases (the same bytes) or strided copies
// (permute, transpose, expand, select, slice, unbind, stack, cat), and
// constants and the scatter of slice/select gradients.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lowering_util.h"
#include "neuron/runtime/error.h"
#include "op_lowerings.h"

namespace neuron::compiler {

// view, reshape, detach, clone, alias, (un)squeeze: the same elements in
// row-major order are the same bytes (every IR value is contiguous; for
// _reshape_alias the strides are eager's layout).
void LowerCopy(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(
      !call.in.empty() && Elements(cx.TypeOf(call.in[0])) == Elements(out.type()),
      call.where, ": changes the number of elements");
  NEURON_CHECK(out.type().dtype() == cx.TypeOf(call.in[0]).dtype(), call.where,
               ": changes the dtype");
  cx.Alias(out.name(), out, call.in[0]);
}

// aten.t: a strided copy, so any dtype (token ids too), bitwise.
void LowerTranspose2d(LoweringContext& cx, const OpCall& call) {
  const proto::Value& out = SingleOutput(call);
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one input");
  const auto& t = cx.TypeOf(call.in[0]);
  NEURON_CHECK(t.shape_size() == 2, call.where, ": supported for 2-D tensors only");
  NEURON_CHECK(out.type().shape_size() == 2 && out.type().shape(0) == t.shape(1) &&
                   out.type().shape(1) == t.shape(0),
               call.where, ": the transpose of a [", t.shape(0), ", ", t.shape(1),
               "] tensor is [", t.shape(1), ", ", t.shape(0), "]");
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.StridedCopy(call.in[0], out.name(), {t.shape(1), t.shape(0)}, {1, t.shape(1)}, 0,
                 call.source);
}

namespace {

// A view of a tensor's contiguous elements: the result's sizes, the
// input's stride for each of them and the offset of the first element.
struct View {
  std::vector<std::int64_t> sizes, strides;
  std::int64_t offset = 0;
};

// An int or a list of ints, required.
std::vector<std::int64_t> RequiredInts(const OpCall& call, const char* key) {
  NEURON_CHECK(Attr(call.node, key) != nullptr, call.where, ": needs attribute ", key);
  return AttrInts(call.node, key);
}

View Permute(const OpCall& call, const std::vector<std::int64_t>& shape,
             const std::vector<std::int64_t>& strides) {
  const auto dims = RequiredInts(call, "dims");
  NEURON_CHECK(dims.size() == shape.size(), call.where, ": permutes ", dims.size(),
               " dims of a ", shape.size(), "-D tensor");
  View v;
  std::set<std::int64_t> seen;
  for (auto d : dims) {
    const auto k = static_cast<std::size_t>(Dim(d, shape.size(), call.where));
    NEURON_CHECK(seen.insert(static_cast<std::int64_t>(k)).second, call.where, ": dim ",
                 d, " appears twice");
    v.sizes.push_back(shape[k]);
    v.strides.push_back(strides[k]);
  }
  return v;
}

View Transpose(const OpCall& call, const std::vector<std::int64_t>& shape,
               const std::vector<std::int64_t>& strides) {
  View v{shape, strides, 0};
  const auto a = static_cast<std::size_t>(
      Dim(AttrInt(call.node, "dim0", 0), shape.size(), call.where));
  const auto b = static_cast<std::size_t>(
      Dim(AttrInt(call.node, "dim1", 1), shape.size(), call.where));
  std::swap(v.sizes[a], v.sizes[b]);
  std::swap(v.strides[a], v.strides[b]);
  return v;
}

View Expand(const OpCall& call, const std::vector<std::int64_t>& shape,
            const std::vector<std::int64_t>& strides) {
  View v;
  v.sizes = RequiredInts(call, "size");
  NEURON_CHECK(v.sizes.size() >= shape.size(), call.where, ": cannot expand a ",
               shape.size(), "-D tensor to ", v.sizes.size(), " dims");
  const std::size_t lead = v.sizes.size() - shape.size();
  v.strides.assign(v.sizes.size(), 0);
  for (std::size_t d = lead; d < v.sizes.size(); ++d) {
    const std::int64_t had = shape[d - lead];
    if (v.sizes[d] == -1) v.sizes[d] = had;
    NEURON_CHECK(had == v.sizes[d] || had == 1, call.where, ": cannot expand size ", had,
                 " to ", v.sizes[d]);
    v.strides[d] = had == 1 ? 0 : strides[d - lead];
  }
  return v;
}

// Index `index` of dim `d` (select, and each part of unbind).
View Select(const std::vector<std::int64_t>& shape,
            const std::vector<std::int64_t>& strides, std::size_t d, std::int64_t index) {
  View v{shape, strides, index * strides[d]};
  v.sizes.erase(v.sizes.begin() + static_cast<std::ptrdiff_t>(d));
  v.strides.erase(v.strides.begin() + static_cast<std::ptrdiff_t>(d));
  return v;
}

View Slice(const OpCall& call, const std::vector<std::int64_t>& shape,
           const std::vector<std::int64_t>& strides) {
  const auto d = static_cast<std::size_t>(
      Dim(AttrInt(call.node, "dim", 0), shape.size(), call.where));
  std::int64_t start = AttrInt(call.node, "start", 0);
  std::int64_t end = AttrInt(call.node, "end", shape[d]);
  const std::int64_t step = AttrInt(call.node, "step", 1);
  NEURON_CHECK(step >= 1, call.where, ": step ", step, " must be >= 1");
  if (start < 0) start += shape[d];
  if (end < 0) end += shape[d];
  start = std::clamp<std::int64_t>(start, 0, shape[d]);
  end = std::clamp<std::int64_t>(end, start, shape[d]);
  View v{shape, strides, start * strides[d]};
  v.sizes[d] = (end - start + step - 1) / step;
  v.strides[d] = strides[d] * step;
  return v;
}

// stack and cat: each input copied into its part of the result.
void Concatenate(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const bool stack = n.op() == "aten.stack";
  const auto out = Shape(n.outputs(0).type());
  const auto out_strides = ContiguousStrides(out);
  const std::int64_t dim = Dim(AttrInt(n, "dim", 0), out.size(), call.where);
  const auto d = static_cast<std::size_t>(dim);
  std::int64_t offset = 0;
  for (const auto& name : call.in) {
    const auto shape = Shape(cx.TypeOf(name));
    std::vector<std::int64_t> into = out_strides;
    if (stack) {
      NEURON_CHECK(shape.size() + 1 == out.size(), call.where, ": stacks ", shape.size(),
                   "-D tensors into a ", out.size(), "-D one");
      into.erase(into.begin() + dim);
    } else {
      NEURON_CHECK(shape.size() == out.size(), call.where, ": concatenates ",
                   shape.size(), "-D tensors into a ", out.size(), "-D one");
    }
    cx.StridedCopy(name, n.outputs(0).name(), shape, ContiguousStrides(shape), 0,
                   call.source, into, offset * out_strides[d]);
    offset += stack ? 1 : shape[d];
  }
  NEURON_CHECK(offset == out[d], call.where, ": the parts make ", offset, " along dim ",
               dim, ", the result has ", out[d]);
}

// Whether `v` is a run of its input's elements in row-major order from
// element v.offset (a dimension of size 1 may have any stride).
bool Contiguous(const View& v) {
  std::int64_t expect = 1;
  for (std::size_t d = v.sizes.size(); d-- > 0;) {
    if (v.sizes[d] == 1) continue;
    if (v.strides[d] != expect) return false;
    expect *= v.sizes[d];
  }
  return true;
}

// `out` as the view `v` of `in`: the same bytes when the view is a
// contiguous run of them, as on the device (a whole input is an alias, a
// run of one is a part of the SBUF value holding it); else a strided copy.
void ViewInto(LoweringContext& cx, const OpCall& call, const std::string& in,
              const proto::Value& out, const View& v) {
  if (Contiguous(v)) {
    std::int64_t n = 1;
    for (auto size : v.sizes) n *= size;
    if (v.offset == 0 && n == Elements(cx.TypeOf(in)))
      return cx.Alias(out.name(), out, in);
    if (cx.slots().at(cx.Root(in)).space == rp::SBUF)
      return cx.AddPart(out.name(), out, in, v.offset, call.where);
  }
  cx.AddSlot(out.name(), out, rp::SBUF, call.where);
  cx.StridedCopy(in, out.name(), v.sizes, v.strides, v.offset, call.source);
}

// unbind: one select per output.
void Unbind(LoweringContext& cx, const OpCall& call,
            const std::vector<std::int64_t>& shape,
            const std::vector<std::int64_t>& strides) {
  const auto d = static_cast<std::size_t>(
      Dim(AttrInt(call.node, "dim", 0), shape.size(), call.where));
  NEURON_CHECK(call.node.outputs_size() == shape[d], call.where, ": unbinds ", shape[d],
               " tensors, the graph has ", call.node.outputs_size());
  for (int k = 0; k < call.node.outputs_size(); ++k) {
    ViewInto(cx, call, call.in[0], call.node.outputs(k), Select(shape, strides, d, k));
  }
}

}  // namespace

// Data-movement ops: a strided copy each (several for unbind, stack and
// cat), or none for a view that is a contiguous run of its input.
void LowerView(LoweringContext& cx, const OpCall& call) {
  const std::string& op = call.node.op();
  NEURON_CHECK(!call.in.empty(), call.where, ": takes a tensor input");
  if (op == "aten.stack" || op == "aten.cat") {
    cx.AddOutputSlots(call.node, call.where);
    return Concatenate(cx, call);
  }
  NEURON_CHECK(call.in.size() == 1, call.where, ": takes one tensor input");
  const auto shape = Shape(cx.TypeOf(call.in[0]));
  const auto strides = ContiguousStrides(shape);
  if (op == "aten.unbind.int") return Unbind(cx, call, shape, strides);
  View v;
  if (op == "aten.permute") {
    v = Permute(call, shape, strides);
  } else if (op == "aten.transpose.int") {
    v = Transpose(call, shape, strides);
  } else if (op == "aten.expand") {
    v = Expand(call, shape, strides);
  } else if (op == "aten.select.int") {
    const auto d = static_cast<std::size_t>(
        Dim(AttrInt(call.node, "dim", 0), shape.size(), call.where));
    std::int64_t index = AttrInt(call.node, "index", 0);
    if (index < 0) index += shape[d];
    NEURON_CHECK(index >= 0 && index < shape[d], call.where, ": index ", index,
                 " outside dim ", d, " of size ", shape[d]);
    v = Select(shape, strides, d, index);
  } else {  // aten.slice
    v = Slice(call, shape, strides);
  }
  NEURON_CHECK(call.node.outputs_size() == 1, call.where, ": has one output");
  const auto expect = Shape(call.node.outputs(0).type());
  NEURON_CHECK(v.sizes == expect, call.where, ": the view has shape [", Join(v.sizes),
               "], the graph says [", Join(expect), "]");
  ViewInto(cx, call, call.in[0], call.node.outputs(0), v);
}

// zeros, ones, full and their _like forms; slice_backward and
// select_backward (zeros, then the gradient into its part). False when
// `op` is none of them.
void LowerFill(LoweringContext& cx, const OpCall& call) {
  const proto::Node& n = call.node;
  const auto& in = call.in;
  const std::string& where = call.where;
  const std::string& source = call.source;
  static const std::map<std::string, double> kConstant = {
      {"aten.zeros", 0.0},      {"aten.ones", 1.0},      {"aten.zeros_like", 0.0},
      {"aten.ones_like", 1.0},  {"aten.new_zeros", 0.0}, {"aten.new_ones", 1.0},
      {"aten.full", NAN},       {"aten.full_like", NAN}, {"aten.new_full", NAN},
      {"aten.empty_like", 0.0}, {"aten.empty", 0.0}};  // empty: zeros, deterministic
  const std::string& op = n.op();
  const bool backward = op == "aten.slice_backward" || op == "aten.select_backward";
  auto constant = kConstant.find(op);
  NEURON_CHECK(n.outputs_size() == 1, where, ": has one output");
  const proto::Value& out = n.outputs(0);
  cx.AddSlot(out.name(), out, rp::SBUF, where);
  if (!backward) {
    const double value = std::isnan(constant->second) ? AttrNumber(n, "fill_value", 0.0)
                                                      : constant->second;
    cx.Fill(out.name(), value, source);
    return;
  }
  NEURON_CHECK(in.size() == 1, where, ": takes the gradient");
  const auto shape = Shape(out.type());
  const auto strides = ContiguousStrides(shape);
  const auto d = static_cast<std::size_t>(
      Dim(static_cast<std::int64_t>(AttrNumber(n, "dim", 0)), shape.size(), where));
  auto grad = Shape(cx.TypeOf(in[0]));
  std::vector<std::int64_t> into = strides;
  std::int64_t offset;
  if (op == "aten.select_backward") {
    std::int64_t index = static_cast<std::int64_t>(AttrNumber(n, "index", 0));
    if (index < 0) index += shape[d];
    into.erase(into.begin() + static_cast<std::ptrdiff_t>(d));
    offset = index * strides[d];
  } else {
    std::int64_t start = static_cast<std::int64_t>(AttrNumber(n, "start", 0));
    const std::int64_t step = static_cast<std::int64_t>(AttrNumber(n, "step", 1));
    if (start < 0) start += shape[d];
    start = std::clamp<std::int64_t>(start, 0, shape[d]);
    into[d] = strides[d] * step;
    offset = start * strides[d];
  }
  NEURON_CHECK(grad.size() == into.size(), where, ": a ", grad.size(),
               "-D gradient for a ", shape.size(), "-D input");
  cx.Fill(out.name(), 0.0, source);
  cx.StridedCopy(in[0], out.name(), grad, ContiguousStrides(grad), 0, source, into,
                 offset);
}

}  // namespace neuron::compiler
