#include "neuron/compiler/lower.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "neuron/compiler/device_dtypes.h"
#include "neuron/compiler/native_ops.h"
#include "neuron/compiler/passes.h"
#include "neuron/compiler/schedule.h"
#include "neuron/runtime/device/executable.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"
#include "transitive_reduction.h"

namespace neuron::compiler {
namespace {

namespace rp = runtime::proto;

constexpr std::uint64_t kAlignment = 64;

std::int64_t Elements(const proto::TensorType& t) {
  std::int64_t n = 1;
  for (auto d : t.shape()) n *= d;
  return n;
}

// Node attributes: the attribute, or null.
const proto::Attribute* Attr(const proto::Node& n, const char* key) {
  auto it = n.attrs().find(key);
  return it == n.attrs().end() ? nullptr : &it->second;
}

// An int or float attribute as a number.
double Number(const proto::Attribute& a) {
  return a.value_case() == proto::Attribute::kF ? a.f() : static_cast<double>(a.i());
}

// An int or float attribute as a number; `fallback` when absent.
double AttrNumber(const proto::Node& n, const char* key, double fallback) {
  const proto::Attribute* a = Attr(n, key);
  return a == nullptr ? fallback : Number(*a);
}

// An int attribute; `fallback` when absent.
std::int64_t AttrInt(const proto::Node& n, const char* key, std::int64_t fallback) {
  const proto::Attribute* a = Attr(n, key);
  return a == nullptr ? fallback : a->i();
}

// An int or a list of ints; empty when absent.
std::vector<std::int64_t> AttrInts(const proto::Node& n, const char* key) {
  const proto::Attribute* a = Attr(n, key);
  if (a == nullptr) return {};
  if (a->value_case() == proto::Attribute::kI) return {a->i()};
  return {a->ints().values().begin(), a->ints().values().end()};
}

// A value of the program and where it lives.
struct Slot {
  proto::Value value;
  rp::MemorySpace space = rp::SBUF;
  rp::ElementType dtype = rp::F32;
  std::uint64_t bytes = 0;
  std::uint32_t buffer = 0;
  std::string alias_of;     // a view: the slot whose bytes it is ("": its own)
};

// An instruction before placement: values by slot name.
struct Step {
  rp::Instruction instruction;  // engine, op, cost parameters, source
  std::vector<std::string> reads, writes;
  // A fused step: per sub-op, the slots it reads ("" for the previous result).
  std::vector<std::vector<std::string>> fused_reads;
};

class Lowering {
 public:
  Lowering(const proto::Graph& g, const runtime::DeviceSpec& device)
      : g_(g), device_(device) {}

  Lowered Run(const std::string& graph_id) {
    VerifyGraph(g_);
    for (const auto& v : g_.inputs()) AddHbm(v, "input");
    for (const auto& c : g_.constants()) AddHbm(c.value(), "constant");
    for (int i = 0; i < g_.nodes_size(); ++i) LowerNode(i, g_.nodes(i));
    for (const auto& out : g_.outputs()) Store(out);
    for (auto& step : steps_) {  // from here on, views are the slots they view
      for (auto& r : step.reads) r = Root(r);
      for (auto& w : step.writes) w = Root(w);
    }
    FuseElementwise();
    Lowered out = Emit(graph_id);
    out.schedule = ScheduleInstructions(out.executable, runtime::CostModel(device_));
    return out;
  }

 private:
  std::string Where(int i, const proto::Node& n) const {
    return StrCat("graph ", g_.name(), ": node ", i, " (", n.op(), ")",
                  n.source().empty() ? "" : " from " + n.source());
  }

  Slot& AddSlot(const std::string& name, const proto::Value& v, rp::MemorySpace space,
                const std::string& where) {
    Slot s;
    s.value = v;
    s.space = space;
    s.dtype = DeviceElementType(v.type().dtype(), where);
    s.bytes =
        static_cast<std::uint64_t>(Elements(v.type())) * runtime::ElementBytes(s.dtype);
    s.buffer = static_cast<std::uint32_t>(slots_.size());
    order_.push_back(name);
    return slots_[name] = s;
  }

  // A slot in SBUF for every output of `n`; returns their names in order.
  std::vector<std::string> AddOutputSlots(const proto::Node& n, const std::string& where) {
    std::vector<std::string> names;
    for (const auto& out : n.outputs()) {
      AddSlot(out.name(), out, rp::SBUF, where);
      names.push_back(out.name());
    }
    return names;
  }

  // `name` is a view of `of`: its own type, `of`'s bytes and buffer.
  void Alias(const std::string& name, const proto::Value& v, const std::string& of) {
    Slot s = slots_.at(of);
    s.value = v;
    s.alias_of = Root(of);
    slots_[name] = s;
  }

  // The slot that owns `name`'s bytes.
  std::string Root(const std::string& name) const {
    const std::string& of = slots_.at(name).alias_of;
    return of.empty() ? name : of;
  }

  void AddHbm(const proto::Value& v, const char* kind) {
    AddSlot("hbm:" + v.name(), v, rp::HBM,
            StrCat("graph ", g_.name(), ": ", kind, " %", v.name()));
  }

  // The on-chip copy of a value, loading it from HBM the first time.
  std::string OnChip(const std::string& name) {
    if (slots_.count(name)) return name;
    const Slot& hbm = slots_.at("hbm:" + name);
    AddSlot(name, hbm.value, rp::SBUF, "load");
    Dma("load", "hbm:" + name, name, "load %" + name);
    return name;
  }

  void Dma(const std::string& op, const std::string& from, const std::string& to,
           const std::string& source) {
    Step s;
    s.instruction.set_engine(rp::DMA);
    s.instruction.set_op(op);
    s.instruction.set_bytes(slots_.at(from).bytes);
    const auto& shape = slots_.at(from).value.type().shape();
    s.instruction.set_partitions(static_cast<std::uint32_t>(
        std::clamp<std::int64_t>(shape.empty() ? 1 : shape[0], 1, 128)));
    s.instruction.set_source(source);
    s.reads = {from};
    s.writes = {to};
    steps_.push_back(std::move(s));
  }

  // A step on `engine` over the elements of its first output, reading
  // `operands` operands (default: one per read, at least one); the caller
  // sets the op's other fields on the returned instruction.
  rp::Instruction& AddStep(rp::EngineKind engine, const std::string& op,
                           std::vector<std::string> reads, std::vector<std::string> writes,
                           const std::string& source, int operands = -1) {
    Step s;
    s.instruction.set_engine(engine);
    s.instruction.set_op(op);
    s.instruction.set_elements(Elements(slots_.at(writes.at(0)).value.type()));
    s.instruction.set_operand_count(static_cast<std::uint32_t>(
        operands >= 0 ? operands : std::max<std::size_t>(reads.size(), 1)));
    s.instruction.set_source(source);
    s.reads = std::move(reads);
    s.writes = std::move(writes);
    steps_.push_back(std::move(s));
    return steps_.back().instruction;
  }

  void Elementwise(rp::EngineKind engine, const std::string& op,
                   std::vector<std::string> reads, const std::string& write,
                   const std::string& source) {
    const int operands = static_cast<int>(reads.size());
    AddStep(engine, op, std::move(reads), {write}, source, operands);
  }

  // A view of `from`'s contiguous elements (sizes, strides, offset) into
  // `to`: contiguous, or at `out_strides` and `out_offset` (a part of it).
  void StridedCopy(const std::string& from, const std::string& to,
                   const std::vector<std::int64_t>& sizes,
                   const std::vector<std::int64_t>& strides, std::int64_t offset,
                   const std::string& source, const std::vector<std::int64_t>& out_strides = {},
                   std::int64_t out_offset = 0) {
    rp::Instruction& i = AddStep(rp::VECTOR, "strided_copy", {from}, {to}, source, 1);
    std::int64_t n = 1;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      n *= sizes[d];
      i.add_view_sizes(sizes[d]);
      i.add_in_strides(strides[d]);
    }
    for (auto st : out_strides) i.add_out_strides(st);
    i.set_in_offset(offset);
    i.set_out_offset(out_offset);
    i.set_elements(n);  // the view's: a part of `to` when it is written in parts
  }

  // Every element of `to` set to `value`.
  void Fill(const std::string& to, double value, const std::string& source) {
    AddStep(rp::VECTOR, "fill", {}, {to}, source).set_scalar(value);
  }

  // zeros, ones, full and their _like forms; slice_backward and
  // select_backward (zeros, then the gradient into its part). False when
  // `op` is none of them.
  bool LowerFill(const proto::Node& n, const std::vector<std::string>& in,
                 const std::string& where, const std::string& source) {
    static const std::map<std::string, double> kConstant = {
        {"aten.zeros", 0.0},      {"aten.ones", 1.0},     {"aten.zeros_like", 0.0},
        {"aten.ones_like", 1.0},  {"aten.new_zeros", 0.0}, {"aten.new_ones", 1.0},
        {"aten.full", NAN},       {"aten.full_like", NAN}, {"aten.new_full", NAN},
        {"aten.empty_like", 0.0}, {"aten.empty", 0.0}};  // empty: zeros, deterministic
    const std::string& op = n.op();
    const bool backward = op == "aten.slice_backward" || op == "aten.select_backward";
    auto constant = kConstant.find(op);
    if (constant == kConstant.end() && !backward) return false;
    NEURON_CHECK(n.outputs_size() == 1, where, ": has one output");
    const proto::Value& out = n.outputs(0);
    AddSlot(out.name(), out, rp::SBUF, where);
    if (!backward) {
      const double value = std::isnan(constant->second) ? AttrNumber(n, "fill_value", 0.0)
                                                        : constant->second;
      Fill(out.name(), value, source);
      return true;
    }
    NEURON_CHECK(in.size() == 1, where, ": takes the gradient");
    const auto shape = Shape(out.type());
    const auto strides = ContiguousStrides(shape);
    const auto d = static_cast<std::size_t>(
        Dim(static_cast<std::int64_t>(AttrNumber(n, "dim", 0)), shape.size(), where));
    auto grad = Shape(slots_.at(in[0]).value.type());
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
    Fill(out.name(), 0.0, source);
    StridedCopy(in[0], out.name(), grad, ContiguousStrides(grad), 0, source, into, offset);
    return true;
  }

  // embedding (table, indices) and embedding_dense_backward (grad,
  // indices), on GpSimd; and arange. False when `op` is none of them.
  bool LowerIndexing(const proto::Node& n, const std::vector<std::string>& in,
                     const std::string& where, const std::string& source) {
    const std::string& op = n.op();
    const bool arange = op.rfind("aten.arange", 0) == 0;
    if (op != "aten.embedding" && op != "aten.embedding_dense_backward" && !arange) {
      return false;
    }
    NEURON_CHECK(n.outputs_size() == 1, where, ": has one output");
    const proto::Value& out = n.outputs(0);
    AddSlot(out.name(), out, rp::SBUF, where);
    if (arange) {
      const double start = AttrNumber(n, "start", 0.0), step = AttrNumber(n, "step", 1.0);
      NEURON_CHECK(step != 0, where, ": step 0");
      rp::Instruction& i = AddStep(rp::GPSIMD, "iota", {}, {out.name()}, source);
      i.set_scalar(start);
      i.set_step(step);
      return true;
    }
    NEURON_CHECK(in.size() == 2, where, ": takes rows and indices");
    const auto& rows = slots_.at(in[0]).value.type();
    const std::int64_t indices = Elements(slots_.at(in[1]).value.type());
    if (op == "aten.embedding") {
      NEURON_CHECK(rows.shape_size() == 2, where, ": the table must be 2-D");
      rp::Instruction& i = AddStep(rp::GPSIMD, "gather_rows", in, {out.name()}, source, 1);
      i.set_m(indices);
      i.set_k(rows.shape(0));
      i.set_n(rows.shape(1));
      return true;
    }
    NEURON_CHECK(AttrNumber(n, "scale_grad_by_freq", 0) == 0, where,
                 ": scale_grad_by_freq is not supported on the device");
    const std::int64_t cols = rows.shape_size() == 0 ? 0 : rows.shape(rows.shape_size() - 1);
    const auto weights = static_cast<std::int64_t>(AttrNumber(n, "num_weights", 0));
    NEURON_CHECK(Elements(out.type()) == weights * cols, where, ": the gradient of ", weights,
                 " rows of ", cols);
    rp::Instruction& i = AddStep(rp::GPSIMD, "scatter_add_rows", in, {out.name()}, source, 1);
    i.set_m(indices);
    i.set_k(weights);
    i.set_n(cols);
    i.set_scalar(AttrNumber(n, "padding_idx", -1));
    return true;
  }

  // An operand of an elementwise op whose result is `out`, under numpy
  // broadcasting: itself when it has the result's elements, or (with
  // `may_repeat`) when the engines' repetition of a shorter operand gives
  // the broadcast (its shape, without leading 1s, ends the result's: a
  // bias); otherwise a strided copy expanding it to the result's shape.
  std::string Broadcast(const std::string& name, const proto::Value& out, bool may_repeat,
                        const std::string& where, const std::string& source) {
    const auto shape = Shape(slots_.at(name).value.type());
    const auto target = Shape(out.type());
    if (shape == target) return name;
    std::vector<std::int64_t> core = shape;
    while (!core.empty() && core.front() == 1) core.erase(core.begin());
    const bool suffix = core.size() <= target.size() &&
                        std::equal(core.begin(), core.end(), target.end() - core.size());
    if (suffix && (may_repeat || Elements(slots_.at(name).value.type()) == Elements(out.type()))) {
      return name;
    }
    NEURON_CHECK(shape.size() <= target.size(), where, ": cannot broadcast [", Join(shape),
                 "] to [", Join(target), "]");
    const auto strides = ContiguousStrides(shape);
    std::vector<std::int64_t> view(target.size(), 0);
    const std::size_t lead = target.size() - shape.size();
    for (std::size_t d = 0; d < shape.size(); ++d) {
      NEURON_CHECK(shape[d] == target[lead + d] || shape[d] == 1, where, ": cannot broadcast [",
                   Join(shape), "] to [", Join(target), "]");
      view[lead + d] = shape[d] == 1 ? 0 : strides[d];
    }
    proto::Value expanded = slots_.at(name).value;
    expanded.set_name(name + ".to." + out.name());
    *expanded.mutable_type()->mutable_shape() = out.type().shape();
    if (!slots_.count(expanded.name())) {
      AddSlot(expanded.name(), expanded, rp::SBUF, where);
      StridedCopy(name, expanded.name(), target, view, 0, source);
    }
    return expanded.name();
  }

  // native_dropout (x, seed) {p, train, stream} -> (y, mask): the mask from
  // a counter-based hash of (seed, stream, element), on GpSimd; and
  // native_dropout_backward (grad, mask) {scale}. False for other ops.
  bool LowerDropout(const proto::Node& n, const std::vector<std::string>& in,
                    const std::string& where, const std::string& source) {
    const std::string& op = n.op();
    const bool bernoulli = op == "aten.bernoulli_.float" || op == "aten.bernoulli.p";
    if (op != "aten.native_dropout" && op != "aten.native_dropout_backward" && !bernoulli) {
      return false;
    }
    const std::vector<std::string> writes = AddOutputSlots(n, where);
    const double p = AttrNumber(n, "p", 0.5);
    const auto stream = static_cast<std::int64_t>(AttrNumber(n, "stream", 0));
    if (bernoulli) {  // (shape source, seed) {p, stream}: 1 with probability p, else 0
      NEURON_CHECK(in.size() == 2 && n.outputs_size() == 1, where,
                   ": takes a tensor and the run's seed");
      NEURON_CHECK(p >= 0 && p <= 1, where, ": p ", p, " must be in [0, 1]");
      rp::Instruction& i = AddStep(rp::GPSIMD, "bernoulli", in, writes, source);
      i.set_scalar(p);
      i.set_k(stream);
    } else if (op == "aten.native_dropout") {
      NEURON_CHECK(in.size() == 2 && n.outputs_size() == 2, where,
                   ": takes the input and the run's seed, gives the result and the mask");
      NEURON_CHECK(p >= 0 && p < 1, where, ": p ", p, " must be in [0, 1)");
      rp::Instruction& i = AddStep(rp::GPSIMD, "dropout", in, writes, source);
      i.set_scalar(AttrNumber(n, "train", 1) != 0 ? p : 0.0);
      i.set_k(stream);
    } else {
      NEURON_CHECK(in.size() == 2 && n.outputs_size() == 1, where,
                   ": takes the gradient and the mask");
      AddStep(rp::GPSIMD, "masked_scale", in, writes, source)
          .set_scalar(AttrNumber(n, "scale", 1.0));
    }
    return true;
  }

  // A value of `dtype` and `shape` for an intermediate slot.
  static proto::Value Temp(const std::string& name, const std::string& dtype,
                           const std::vector<std::int64_t>& shape) {
    proto::Value v;
    v.set_name(name);
    v.mutable_type()->set_dtype(dtype);
    for (auto d : shape) v.mutable_type()->add_shape(d);
    return v;
  }

  // A GpSimd window step (im2col, col2im, maxpool2d and its backward) with
  // the geometry `g` (N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW).
  void WindowStep(const std::string& op, const std::vector<std::string>& reads,
                  const std::vector<std::string>& writes, const std::vector<std::int64_t>& g,
                  const std::string& source) {
    rp::Instruction& i = AddStep(rp::GPSIMD, op, reads, writes, source, 1);
    for (auto v : g) i.add_view_sizes(v);
  }

  // convolution (x, weight[, bias]) and convolution_backward (grad, x,
  // weight -> grad x, grad weight, grad bias): 2-D, groups 1, not
  // transposed; as im2col on GpSimd and matmuls on the tensor engine (the
  // bias added as the rows leave PSUM), col2im for the input's gradient.
  // max_pool2d_with_indices and its backward on GpSimd. False for other ops.
  bool LowerWindows(const proto::Node& n, const std::vector<std::string>& in,
                    const std::string& where, const std::string& source) {
    const std::string& op = n.op();
    const bool conv = op == "aten.convolution", conv_back = op == "aten.convolution_backward";
    const bool pool = op == "aten.max_pool2d_with_indices",
               pool_back = op == "aten.max_pool2d_with_indices_backward";
    if (!conv && !conv_back && !pool && !pool_back) return false;
    auto pair = [&](const char* key, std::int64_t fallback) {  // (h, w)
      std::vector<std::int64_t> v = AttrInts(n, key);
      if (v.empty()) v = {fallback};
      if (v.size() == 1) v.push_back(v[0]);
      return v;
    };
    NEURON_CHECK(!in.empty(), where, ": takes tensor inputs");
    const auto x_shape = Shape(slots_.at(in[conv_back || pool_back ? 1 : 0]).value.type());
    NEURON_CHECK(x_shape.size() == 4, where, ": supported for [N, C, H, W] inputs");
    const std::int64_t N = x_shape[0], C = x_shape[1], H = x_shape[2], W = x_shape[3];
    // The window geometry, output size last (torch's formula, no ceil_mode).
    auto geometry = [&](std::int64_t kh, std::int64_t kw, const std::vector<std::int64_t>& stride,
                        const std::vector<std::int64_t>& pad,
                        const std::vector<std::int64_t>& dil) -> std::vector<std::int64_t> {
      const std::int64_t oh = (H + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
      const std::int64_t ow = (W + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
      return {N, C, H, W, kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], oh, ow};
    };
    AddOutputSlots(n, where);
    if (pool || pool_back) {
      const auto kernel = pair("kernel_size", 1);
      auto stride = pair("stride", 0);
      if (stride[0] == 0) stride = kernel;  // torch: the kernel size by default
      const auto pad = pair("padding", 0), dil = pair("dilation", 1);
      NEURON_CHECK(AttrInt(n, "ceil_mode", 0) == 0, where, ": ceil_mode is not supported");
      const std::vector<std::int64_t> g = geometry(kernel[0], kernel[1], stride, pad, dil);
      if (pool) {
        NEURON_CHECK(n.outputs_size() == 2, where, ": gives the maxima and the indices");
        WindowStep("maxpool2d", {in[0]}, {n.outputs(0).name(), n.outputs(1).name()}, g, source);
      } else {
        NEURON_CHECK(in.size() == 3, where, ": takes the gradient, the input and the indices");
        WindowStep("maxpool2d_backward", {in[0], in[2]}, {n.outputs(0).name()}, g, source);
      }
      return true;
    }
    NEURON_CHECK(AttrInt(n, "transposed", 0) == 0 && AttrInt(n, "groups", 1) == 1, where,
                 ": supported for groups 1, not transposed");
    const auto w_shape = Shape(slots_.at(in[conv ? 1 : 2]).value.type());
    NEURON_CHECK(w_shape.size() == 4 && w_shape[1] == C, where,
                 ": a [OC, C, KH, KW] weight for C = ", C);
    const std::int64_t OC = w_shape[0], KH = w_shape[2], KW = w_shape[3];
    const auto stride = pair("stride", 1), pad = pair("padding", 0), dil = pair("dilation", 1);
    const std::vector<std::int64_t> g = geometry(KH, KW, stride, pad, dil);
    const std::int64_t OH = g[12], OW = g[13];
    const std::int64_t M = N * OH * OW, K = C * KH * KW;
    const std::string base = n.outputs(0).name();
    const std::string dtype = slots_.at(in[conv ? 0 : 1]).value.type().dtype();
    const std::string cols = base + ".cols";
    AddSlot(cols, Temp(cols, dtype, {M, K}), rp::SBUF, where);
    WindowStep("im2col", {in[conv ? 0 : 1]}, {cols}, g, source);
    const std::string weight = in[conv ? 1 : 2];
    if (conv) {
      // rows [M, OC] = cols x weight^T (+ bias), then to [N, OC, OH, OW].
      const std::string wt = base + ".wt";
      AddSlot(wt, Temp(wt, dtype, {K, OC}), rp::SBUF, where);
      StridedCopy(weight, wt, {K, OC}, {1, K}, 0, source);
      const std::string rows = base + ".rows";
      const proto::Value rows_value = Temp(rows, n.outputs(0).type().dtype(), {M, OC});
      Matmul(cols, wt, rows_value, M, K, OC, 0, where, source,
             in.size() > 2 ? in[2] : std::string());
      StridedCopy(rows, base, {N, OC, OH, OW}, {OH * OW * OC, 1, OW * OC, OC}, 0, source);
      return true;
    }
    // Backward: grad rows [M, OC] from the gradient [N, OC, OH, OW].
    NEURON_CHECK(in.size() == 3 && n.outputs_size() == 3, where,
                 ": takes (grad, input, weight), gives three gradients");
    const std::string grows = base + ".grows", growst = base + ".growst";
    const std::string gdtype = slots_.at(in[0]).value.type().dtype();
    AddSlot(grows, Temp(grows, gdtype, {M, OC}), rp::SBUF, where);
    StridedCopy(in[0], grows, {N, OH, OW, OC}, {OC * OH * OW, OW, 1, OH * OW}, 0, source);
    AddSlot(growst, Temp(growst, gdtype, {OC, M}), rp::SBUF, where);
    StridedCopy(grows, growst, {OC, M}, {1, OC}, 0, source);
    // grad weight [OC, K] = grows^T x cols.
    const std::string gw = base + ".gw";
    Matmul(growst, cols, Temp(gw, n.outputs(1).type().dtype(), {OC, K}), OC, M, K, 0, where,
           source);
    StridedCopy(gw, n.outputs(1).name(), {OC * K}, {1}, 0, source);
    // grad input: col2im(grows x weight [OC, K]).
    const std::string gcols = base + ".gcols";
    Alias(base + ".wflat", Temp(base + ".wflat", slots_.at(weight).value.type().dtype(), {OC, K}),
          weight);
    Matmul(grows, base + ".wflat", Temp(gcols, n.outputs(0).type().dtype(), {M, K}), M, OC, K, 0,
           where, source);
    WindowStep("col2im", {gcols}, {base}, g, source);
    // grad bias [OC]: the gradient's rows summed.
    Elementwise(rp::VECTOR, "sum_rows", {grows}, n.outputs(2).name(), source);
    steps_.back().instruction.set_m(M);
    steps_.back().instruction.set_n(OC);
    return true;
  }

  static std::vector<std::int64_t> Shape(const proto::TensorType& t) {
    return {t.shape().begin(), t.shape().end()};
  }

  static std::vector<std::int64_t> ContiguousStrides(const std::vector<std::int64_t>& shape) {
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t stride = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      strides[static_cast<std::size_t>(d)] = stride;
      stride *= shape[static_cast<std::size_t>(d)];
    }
    return strides;
  }

  // A dimension attribute, negative counting from the end, checked.
  static std::int64_t Dim(std::int64_t d, std::size_t rank, const std::string& where) {
    const auto r = static_cast<std::int64_t>(rank);
    NEURON_CHECK(d >= -r && d < std::max<std::int64_t>(r, 1), where, ": dim ", d,
                 " is outside a ", rank, "-D tensor");
    return d < 0 ? d + r : d;
  }

  // Data-movement ops as one strided copy each (several for unbind and
  // stack); false when `op` is none of them.
  bool LowerView(const proto::Node& n, const std::vector<std::string>& in,
                 const std::string& where, const std::string& source) {
    const std::string& op = n.op();
    auto ints = [&](const char* key) {  // an int or a list of ints, required
      NEURON_CHECK(Attr(n, key) != nullptr, where, ": needs attribute ", key);
      return AttrInts(n, key);
    };
    static const std::set<std::string> kViews = {
        "aten.permute", "aten.transpose.int", "aten.expand",
        "aten.unbind.int",     "aten.select.int", "aten.slice", "aten.stack",
        "aten.cat"};
    if (!kViews.count(op)) return false;
    NEURON_CHECK(!in.empty(), where, ": takes a tensor input");
    AddOutputSlots(n, where);
    if (op == "aten.stack" || op == "aten.cat") {
      const auto out = Shape(n.outputs(0).type());
      const auto out_strides = ContiguousStrides(out);
      const std::int64_t dim = Dim(AttrInt(n, "dim", 0), out.size(), where);
      std::int64_t offset = 0;
      for (const auto& name : in) {
        const auto shape = Shape(slots_.at(name).value.type());
        std::vector<std::int64_t> into = out_strides;
        if (op == "aten.stack") {
          NEURON_CHECK(shape.size() + 1 == out.size(), where, ": stacks ", shape.size(),
                       "-D tensors into a ", out.size(), "-D one");
          into.erase(into.begin() + dim);
        } else {
          NEURON_CHECK(shape.size() == out.size(), where, ": concatenates ", shape.size(),
                       "-D tensors into a ", out.size(), "-D one");
        }
        StridedCopy(name, n.outputs(0).name(), shape, ContiguousStrides(shape), 0, source, into,
                    offset * out_strides[static_cast<std::size_t>(dim)]);
        offset += op == "aten.stack" ? 1 : shape[static_cast<std::size_t>(dim)];
      }
      NEURON_CHECK(offset == out[static_cast<std::size_t>(dim)], where, ": the parts make ",
                   offset, " along dim ", dim, ", the result has ",
                   out[static_cast<std::size_t>(dim)]);
      return true;
    }
    NEURON_CHECK(in.size() == 1, where, ": takes one tensor input");
    const auto shape = Shape(slots_.at(in[0]).value.type());
    const auto strides = ContiguousStrides(shape);
    const std::string& result = n.outputs(0).name();
    const auto expect = Shape(n.outputs(0).type());
    std::vector<std::int64_t> sizes, view;
    std::int64_t offset = 0;
    if (op == "aten.permute") {
      const auto dims = ints("dims");
      NEURON_CHECK(dims.size() == shape.size(), where, ": permutes ", dims.size(),
                   " dims of a ", shape.size(), "-D tensor");
      std::set<std::int64_t> seen;
      for (auto d : dims) {
        const auto k = static_cast<std::size_t>(Dim(d, shape.size(), where));
        NEURON_CHECK(seen.insert(static_cast<std::int64_t>(k)).second, where,
                     ": dim ", d, " appears twice");
        sizes.push_back(shape[k]);
        view.push_back(strides[k]);
      }
    } else if (op == "aten.transpose.int") {
      sizes = shape;
      view = strides;
      const auto a = static_cast<std::size_t>(Dim(AttrInt(n, "dim0", 0), shape.size(), where));
      const auto b = static_cast<std::size_t>(Dim(AttrInt(n, "dim1", 1), shape.size(), where));
      std::swap(sizes[a], sizes[b]);
      std::swap(view[a], view[b]);
    } else if (op == "aten.expand") {
      sizes = ints("size");
      NEURON_CHECK(sizes.size() >= shape.size(), where, ": cannot expand a ", shape.size(),
                   "-D tensor to ", sizes.size(), " dims");
      const std::size_t lead = sizes.size() - shape.size();
      view.assign(sizes.size(), 0);
      for (std::size_t d = lead; d < sizes.size(); ++d) {
        const std::int64_t had = shape[d - lead];
        if (sizes[d] == -1) sizes[d] = had;
        NEURON_CHECK(had == sizes[d] || had == 1, where, ": cannot expand size ", had,
                     " to ", sizes[d]);
        view[d] = had == 1 ? 0 : strides[d - lead];
      }
    } else if (op == "aten.unbind.int" || op == "aten.select.int") {
      const auto d = static_cast<std::size_t>(Dim(AttrInt(n, "dim", 0), shape.size(), where));
      sizes = shape;
      view = strides;
      sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(d));
      view.erase(view.begin() + static_cast<std::ptrdiff_t>(d));
      if (op == "aten.unbind.int") {
        NEURON_CHECK(n.outputs_size() == shape[d], where, ": unbinds ", shape[d],
                     " tensors, the graph has ", n.outputs_size());
        for (int k = 0; k < n.outputs_size(); ++k) {
          StridedCopy(in[0], n.outputs(k).name(), sizes, view, k * strides[d], source);
        }
        return true;
      }
      std::int64_t index = AttrInt(n, "index", 0);
      if (index < 0) index += shape[d];
      NEURON_CHECK(index >= 0 && index < shape[d], where, ": index ", index,
                   " outside dim ", d, " of size ", shape[d]);
      offset = index * strides[d];
    } else {  // aten.slice
      const auto d = static_cast<std::size_t>(Dim(AttrInt(n, "dim", 0), shape.size(), where));
      std::int64_t start = AttrInt(n, "start", 0), end = AttrInt(n, "end", shape[d]);
      const std::int64_t step = AttrInt(n, "step", 1);
      NEURON_CHECK(step >= 1, where, ": step ", step, " must be >= 1");
      if (start < 0) start += shape[d];
      if (end < 0) end += shape[d];
      start = std::clamp<std::int64_t>(start, 0, shape[d]);
      end = std::clamp<std::int64_t>(end, start, shape[d]);
      sizes = shape;
      view = strides;
      sizes[d] = (end - start + step - 1) / step;
      view[d] = strides[d] * step;
      offset = start * strides[d];
    }
    NEURON_CHECK(sizes == expect, where, ": the view has shape [", Join(sizes),
                 "], the graph says [", Join(expect), "]");
    StridedCopy(in[0], result, sizes, view, offset, source);
    return true;
  }

  static std::string Join(const std::vector<std::int64_t>& v) {
    std::string s;
    for (auto x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
    return s;
  }

  // sum.dim_IntList (and mean) over any dims: the reduced dims moved to the
  // front (one strided copy, unless they lead already), then a row sum
  // (then scaled, for a mean).
  void LowerSum(const proto::Node& n, const std::vector<std::string>& in,
                const std::string& where, const std::string& source) {
    NEURON_CHECK(in.size() == 1, where, ": takes one input");
    const proto::Value& out = n.outputs(0);
    const auto shape = Shape(slots_.at(in[0]).value.type());
    std::set<std::size_t> reduced;
    const std::vector<std::int64_t> dims = AttrInts(n, "dim");
    for (auto d : dims) reduced.insert(static_cast<std::size_t>(Dim(d, shape.size(), where)));
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
    AddSlot(out.name(), out, rp::SBUF, where);
    std::string from = in[0];
    if (!leading) {
      proto::Value moved = slots_.at(in[0]).value;
      moved.set_name(out.name() + ".moved");
      from = moved.name();
      AddSlot(from, moved, rp::SBUF, where);
      StridedCopy(in[0], from, sizes, view, 0, source);
    }
    const bool mean = n.op().rfind("aten.mean", 0) == 0;
    std::string sum = out.name();
    if (mean) {  // the sum, then scaled by 1 / the count
      proto::Value total = out;
      total.set_name(out.name() + ".sum");
      sum = total.name();
      AddSlot(sum, total, rp::SBUF, where);
    }
    Elementwise(rp::VECTOR, "sum_rows", {from}, sum, source);
    steps_.back().instruction.set_m(rows);
    steps_.back().instruction.set_n(cols);
    if (mean) {
      Elementwise(rp::VECTOR, "scale", {sum}, out.name(), source);
      steps_.back().instruction.set_scalar(rows == 0 ? NAN : 1.0 / static_cast<double>(rows));
    }
  }

  void LowerNode(int i, const proto::Node& n) {
    const std::string where = Where(i, n);
    NEURON_CHECK(IsNativeOp(n.op()), where, ": is not supported on the device");
    const std::string source = n.source().empty() ? n.op() : n.source();
    std::vector<std::string> in;
    for (const auto& name : n.inputs()) in.push_back(OnChip(name));
    auto attr = [&](const char* key) { return Attr(n, key); };
    const std::string& op = n.op();
    if (op == "aten.native_layer_norm" || op == "aten.native_layer_norm_backward") {
      LowerLayerNorm(n, in, where, source);
      return;
    }
    if (op == "aten.nll_loss_forward" || op == "aten.nll_loss_backward") {
      LowerNllLoss(n, in, where, source);
      return;
    }
    if (LowerView(n, in, where, source)) return;
    if (LowerFill(n, in, where, source)) return;
    if (LowerIndexing(n, in, where, source)) return;
    if (LowerDropout(n, in, where, source)) return;
    if (LowerWindows(n, in, where, source)) return;
    NEURON_CHECK(n.outputs_size() == 1, where, ": is not supported on the device (",
                 n.outputs_size(), " outputs)");
    const proto::Value& out = n.outputs(0);
    if (op == "aten.sum.dim_IntList" || op == "aten.sum" || op == "aten.mean" ||
        op == "aten.mean.dim") {
      LowerSum(n, in, where, source);
      return;
    }
    if (op == "aten.bmm") {  // [B,M,K] x [B,K,N]
      NEURON_CHECK(in.size() == 2, where, ": takes 2 inputs");
      const auto& a = slots_.at(in[0]).value.type();
      const auto& b = slots_.at(in[1]).value.type();
      NEURON_CHECK(a.shape_size() == 3 && b.shape_size() == 3 && a.shape(0) == b.shape(0) &&
                       a.shape(2) == b.shape(1),
                   where, ": needs [B,M,K] x [B,K,N] operands");
      Matmul(in[0], in[1], out, a.shape(1), a.shape(2), b.shape(2), a.shape(0), where,
             source);
      return;
    }
    static const std::set<std::string> kScalarOps = {
        "aten.div", "aten.mul", "aten.add", "aten.sub",
        "aten.div.Scalar", "aten.mul.Scalar", "aten.add.Scalar", "aten.sub.Scalar"};
    if (const auto* other = attr("other");
        other != nullptr && in.size() == 1 && kScalarOps.count(op)) {
      // A tensor and a number: scale or add_scalar.
      const double v = Number(*other);
      if (const auto* alpha = attr("alpha")) {
        const double a = Number(*alpha);
        NEURON_CHECK(a == 1.0, where, ": alpha ", a, " is not supported on the device (only 1)");
      }
      AddSlot(out.name(), out, rp::SBUF, where);
      const std::string base = op.substr(0, op.find(".Scalar"));
      const bool scale = base == "aten.div" || base == "aten.mul";
      Elementwise(rp::VECTOR, scale ? "scale" : "add_scalar", in, out.name(), source);
      steps_.back().instruction.set_scalar(base == "aten.div"   ? 1.0 / v
                                           : base == "aten.sub" ? -v
                                                                : v);
      return;
    }
    static const std::map<std::string, std::string> kCompare = {
        {"aten.eq", "compare_eq"}, {"aten.ne", "compare_ne"}, {"aten.lt", "compare_lt"},
        {"aten.le", "compare_le"}, {"aten.gt", "compare_gt"}, {"aten.ge", "compare_ge"}};
    const std::string compared = op.substr(0, op.find(".Scalar"));
    if (auto c = kCompare.find(compared); c != kCompare.end()) {  // -> bool
      AddSlot(out.name(), out, rp::SBUF, where);
      std::vector<std::string> operands = {Broadcast(in[0], out, false, where, source)};
      if (in.size() == 2) operands.push_back(Broadcast(in[1], out, true, where, source));
      Elementwise(rp::VECTOR, c->second, operands, out.name(), source);
      if (in.size() == 1) {
        const auto* other = attr("other");
        NEURON_CHECK(other != nullptr, where, ": compares with a tensor or a number");
        steps_.back().instruction.set_scalar(Number(*other));
      }
      return;
    }
    if (op == "aten.where.self") {  // (cond, a, b)
      NEURON_CHECK(in.size() == 3, where, ": takes a condition and two tensors");
      AddSlot(out.name(), out, rp::SBUF, where);
      Elementwise(rp::VECTOR, "where",
                  {Broadcast(in[0], out, false, where, source),
                   Broadcast(in[1], out, false, where, source),
                   Broadcast(in[2], out, true, where, source)},
                  out.name(), source);
      return;
    }
    if (op == "aten.masked_fill.Scalar") {  // (x, mask) {value}
      NEURON_CHECK(in.size() == 2, where, ": takes a tensor and a mask");
      AddSlot(out.name(), out, rp::SBUF, where);
      Elementwise(rp::VECTOR, "masked_fill",
                  {Broadcast(in[0], out, false, where, source),
                   Broadcast(in[1], out, true, where, source)},
                  out.name(), source);
      steps_.back().instruction.set_scalar(AttrNumber(n, "value", 0.0));
      return;
    }
    if (op == "aten.mm" || op == "aten.addmm") {
      // addmm(bias, a, b) = a x b + bias: the matmul, then a vector add.
      const bool addmm = op == "aten.addmm";
      NEURON_CHECK(in.size() == (addmm ? 3u : 2u), where, ": takes ", addmm ? 3 : 2,
                   " inputs");
      if (addmm) {
        for (const char* key : {"alpha", "beta"}) {
          if (const auto* a = attr(key)) {
            const double v = Number(*a);
            NEURON_CHECK(v == 1.0, where, ": ", key, " ", v,
                         " is not supported (only 1)");
          }
        }
      }
      const std::string lhs = in[addmm ? 1 : 0], rhs = in[addmm ? 2 : 1];
      const auto& a = slots_.at(lhs).value.type();
      const auto& b = slots_.at(rhs).value.type();
      NEURON_CHECK(a.shape_size() == 2 && b.shape_size() == 2 && a.shape(1) == b.shape(0),
                   where, ": needs [M,K] x [K,N] operands");
      Matmul(lhs, rhs, out, a.shape(0), a.shape(1), b.shape(1), 0, where, source,
             addmm ? in[0] : std::string());
      return;
    }
    static const std::map<std::string, std::string> kBinary = {{"aten.add", "add"},
                                                               {"aten.sub", "sub"},
                                                               {"aten.mul", "mul"},
                                                               {"aten.div", "div"},
                                                               {"aten.tanh_backward", "tanh_backward"},
                                                               {"aten.sigmoid_backward", "sigmoid_backward"},
                                                               {"aten.maximum", "max"},
                                                               {"aten.minimum", "min"}};
    static const std::map<std::string, std::pair<rp::EngineKind, std::string>> kUnary = {
        {"aten.relu", {rp::VECTOR, "relu"}},       {"aten.neg", {rp::VECTOR, "neg"}},
        {"aten.abs", {rp::VECTOR, "abs"}},         {"aten.sgn", {rp::VECTOR, "sign"}},
        {"aten.sign", {rp::VECTOR, "sign"}},
        {"aten.exp", {rp::SCALAR, "exp"}},         {"aten.tanh", {rp::SCALAR, "tanh"}},
        {"aten.sigmoid", {rp::SCALAR, "sigmoid"}}, {"aten.gelu", {rp::SCALAR, "gelu"}}};
    static const std::set<std::string> kCopies = {
        "aten.view",  "aten._unsafe_view", "aten.reshape",   "aten.detach",     "aten.clone",
        "aten.alias", "aten.unsqueeze",    "aten.squeeze.dim", "aten.squeeze",
        // The values of x.reshape(size): the strides are eager's layout,
        // and every IR value is contiguous.
        "aten._reshape_alias"};
    if (kCopies.count(op)) {  // the same elements in row-major order: the same bytes
      NEURON_CHECK(
          !in.empty() && Elements(slots_.at(in[0]).value.type()) == Elements(out.type()),
          where, ": changes the number of elements");
      NEURON_CHECK(out.type().dtype() == slots_.at(in[0]).value.type().dtype(), where,
                   ": changes the dtype");
      Alias(out.name(), out, in[0]);
      return;
    }
    AddSlot(out.name(), out, rp::SBUF, where);

    if (op == "aten.t") {
      NEURON_CHECK(in.size() == 1, where, ": takes one input");
      const auto& t = slots_.at(in[0]).value.type();
      NEURON_CHECK(t.shape_size() == 2, where, ": supported for 2-D tensors only");
      NEURON_CHECK(out.type().shape_size() == 2 && out.type().shape(0) == t.shape(1) &&
                       out.type().shape(1) == t.shape(0),
                   where, ": the transpose of a [", t.shape(0), ", ", t.shape(1),
                   "] tensor is [", t.shape(1), ", ", t.shape(0), "]");
      // A strided copy: any dtype (token ids too), bitwise.
      StridedCopy(in[0], out.name(), {t.shape(1), t.shape(0)}, {1, t.shape(1)}, 0, source);
      return;
    }
    static const std::map<std::string, std::string> kRows = {
        {"aten._softmax", "softmax_rows"},
        {"aten._log_softmax", "log_softmax_rows"},
        {"aten._softmax_backward_data", "softmax_backward_rows"},
        {"aten._log_softmax_backward_data", "log_softmax_backward_rows"}};
    if (auto rows = kRows.find(op); rows != kRows.end()) {  // over the last dimension
      const std::size_t inputs = op.find("backward") != std::string::npos ? 2 : 1;
      NEURON_CHECK(in.size() == inputs, where, ": takes ", inputs, " tensor input(s)");
      const auto& t = slots_.at(in[0]).value.type();
      NEURON_CHECK(t.shape_size() >= 1, where, ": needs at least one dimension");
      const auto* dim = attr("dim");
      const std::int64_t d = dim == nullptr ? -1 : dim->i();
      NEURON_CHECK(d == -1 || d == t.shape_size() - 1, where,
                   ": supported over the last dimension only, not dim ", d);
      for (const auto& name : in) {
        NEURON_CHECK(Elements(slots_.at(name).value.type()) == Elements(out.type()),
                     where, ": operands and result must have the same elements");
      }
      const std::int64_t cols = t.shape(t.shape_size() - 1);
      Elementwise(rp::SCALAR, rows->second, in, out.name(), source);
      steps_.back().instruction.set_m(cols == 0 ? 0 : Elements(out.type()) / cols);
      steps_.back().instruction.set_n(cols);
      // Three passes over each row (max, exponentials and sum, normalise).
      steps_.back().instruction.set_operand_count(3);
      return;
    }
    if (op == "aten.gelu_backward") {  // (grad, input)
      NEURON_CHECK(in.size() == 2, where, ": takes two tensor inputs");
      const auto* approximate = attr("approximate");
      Elementwise(rp::VECTOR,
                  approximate != nullptr && approximate->s() == "tanh"
                      ? "gelu_backward"
                      : "gelu_exact_backward",
                  in, out.name(), source);
      return;
    }
    if (op == "aten.threshold_backward") {  // (grad, input, threshold)
      NEURON_CHECK(in.size() == 2, where, ": takes two tensor inputs");
      Elementwise(rp::VECTOR, "threshold_backward", in, out.name(), source);
      steps_.back().instruction.set_scalar(AttrNumber(n, "threshold", 0.0));
      return;
    }
    if (auto b = kBinary.find(op); b != kBinary.end()) {
      NEURON_CHECK(in.size() == 2, where, ": takes two inputs");
      if (const auto* alpha = attr("alpha")) {
        const double a = Number(*alpha);
        NEURON_CHECK(a == 1.0, where, ": alpha ", a,
                     " is not supported on the device (only 1)");
      }
      // The first operand at the result's shape; the second may repeat.
      const std::vector<std::string> operands = {Broadcast(in[0], out, false, where, source),
                                                 Broadcast(in[1], out, true, where, source)};
      Elementwise(rp::VECTOR, b->second, operands, out.name(), source);
      return;
    }
    if (auto u = kUnary.find(op); u != kUnary.end()) {
      NEURON_CHECK(in.size() == 1, where, ": takes one input");
      std::string kernel = u->second.second;
      if (kernel == "gelu") {
        const auto* approximate = attr("approximate");
        kernel =
            approximate != nullptr && approximate->s() == "tanh" ? "gelu" : "gelu_exact";
      }
      Elementwise(u->second.first, kernel, in, out.name(), source);
      return;
    }
    throw InvalidUsage(StrCat(where, ": is not supported on the device"));
  }

  // out = lhs x rhs (+ bias) on the tensor engine, `batch` products when
  // > 0: into PSUM (float32), then to SBUF (a copy, or the bias add). A
  // result larger than a quarter of PSUM is computed in tiles of rows (of
  // batches, for bmm), each through PSUM into its rows of the result.
  void Matmul(const std::string& lhs, const std::string& rhs, const proto::Value& out,
              std::int64_t m, std::int64_t k, std::int64_t n, std::int64_t batch,
              const std::string& where, const std::string& source,
              const std::string& bias = "") {
    AddSlot(out.name(), out, rp::SBUF, where);
    if (!bias.empty()) {
      const std::int64_t nb = Elements(slots_.at(bias).value.type());
      NEURON_CHECK(nb > 0 && Elements(out.type()) % nb == 0, where,
                   ": the bias must be [N] or [M,N]");
    }
    const std::int64_t budget = static_cast<std::int64_t>(device_.PsumBytes() / 4);
    const std::int64_t items = std::max<std::int64_t>(batch, 1);
    const std::int64_t row_bytes = n * 4;
    if (items * m * row_bytes <= budget) {
      MatmulTile(lhs, rhs, out.name(), out, m, k, n, batch, bias, where, source);
      return;
    }
    // Tiles: whole batches for bmm, rows for mm.
    const bool batched = batch > 0;
    const std::int64_t unit_bytes = batched ? m * row_bytes : row_bytes;
    NEURON_CHECK(unit_bytes <= budget, where, ": one ", batched ? "product" : "row", " of ",
                 unit_bytes, " bytes does not fit a quarter of PSUM (", budget, " bytes)");
    NEURON_CHECK(bias.empty() || Elements(slots_.at(bias).value.type()) == n, where,
                 ": a tiled matmul takes a bias of [N] only");
    const std::int64_t units = batched ? batch : m;
    const std::int64_t per_tile = std::max<std::int64_t>(1, budget / unit_bytes);
    const auto lhs_shape = Shape(slots_.at(lhs).value.type());
    const auto rhs_shape = Shape(slots_.at(rhs).value.type());
    for (std::int64_t first = 0, t = 0; first < units; first += per_tile, ++t) {
      const std::int64_t count = std::min(per_tile, units - first);
      const std::string tile = StrCat(out.name(), ".tile", t);
      // The operand slices: rows of lhs (mm), or batches of both (bmm).
      auto slice = [&](const std::string& from, const std::vector<std::int64_t>& shape,
                       const std::string& name) {
        std::vector<std::int64_t> sizes = shape;
        sizes[0] = count;
        proto::Value v = slots_.at(from).value;
        v.set_name(name);
        v.mutable_type()->set_shape(0, count);
        AddSlot(name, v, rp::SBUF, where);
        const auto strides = ContiguousStrides(shape);
        StridedCopy(from, name, sizes, strides, first * strides[0], source);
        return name;
      };
      const std::string a = slice(lhs, lhs_shape, tile + ".lhs");
      const std::string b = batched ? slice(rhs, rhs_shape, tile + ".rhs") : rhs;
      proto::Value part = out;
      part.set_name(tile);
      part.mutable_type()->set_shape(0, count);
      AddSlot(tile, part, rp::SBUF, where);
      MatmulTile(a, b, tile, part, batched ? m : count, k, n, batched ? count : 0, bias, where,
                 source);
      const auto out_shape = Shape(out.type());
      std::vector<std::int64_t> sizes = out_shape;
      sizes[0] = count;
      const auto strides = ContiguousStrides(out_shape);
      StridedCopy(tile, out.name(), sizes, ContiguousStrides(sizes), 0, source, strides,
                  first * strides[0]);
    }
  }

  // One matmul through a PSUM buffer into `to` (an SBUF slot of `to_value`).
  void MatmulTile(const std::string& lhs, const std::string& rhs, const std::string& to,
                  const proto::Value& to_value, std::int64_t m, std::int64_t k, std::int64_t n,
                  std::int64_t batch, const std::string& bias, const std::string& where,
                  const std::string& source) {
    proto::Value acc = to_value;
    acc.set_name(to + ".psum");
    acc.mutable_type()->set_dtype("f32");
    AddSlot(acc.name(), acc, rp::PSUM, where);
    Step s;
    s.instruction.set_engine(rp::TENSOR);
    s.instruction.set_op("matmul");
    s.instruction.set_m(m);
    s.instruction.set_k(k);
    s.instruction.set_n(n);
    s.instruction.set_batch(batch);
    s.instruction.set_source(source);
    s.reads = {lhs, rhs};
    s.writes = {acc.name()};
    steps_.push_back(std::move(s));
    if (!bias.empty()) {
      Elementwise(rp::VECTOR, "add", {acc.name(), bias}, to, source);
    } else {
      Elementwise(rp::VECTOR, "copy", {acc.name()}, to, source);
    }
  }

  // native_layer_norm (x, weight, bias -> y, mean, rstd) and its backward
  // (grad, x, mean, rstd, weight, bias -> grad x, grad weight, grad bias),
  // normalising over the last dimension, with weight and bias.
  void LowerLayerNorm(const proto::Node& n, const std::vector<std::string>& in,
                      const std::string& where, const std::string& source) {
    const bool forward = n.op() == "aten.native_layer_norm";
    NEURON_CHECK(
        in.size() == (forward ? 3u : 6u) && n.outputs_size() == 3, where,
        ": supported with weight and bias (elementwise_affine) and all three outputs");
    const auto& x = slots_.at(in[forward ? 0 : 1]).value.type();
    auto it = n.attrs().find("normalized_shape");
    NEURON_CHECK(it != n.attrs().end() && it->second.ints().values_size() == 1 &&
                     x.shape_size() >= 1 &&
                     it->second.ints().values(0) == x.shape(x.shape_size() - 1),
                 where, ": supported over the last dimension only");
    // output_mask is not needed: all three gradients are computed (the
    // graph leaves the unwanted ones unused).
    const std::int64_t cols = x.shape(x.shape_size() - 1);
    const std::vector<std::string> outs = AddOutputSlots(n, where);
    // Over the elements of x (the first output has its shape), in passes
    // over each row: 3 forward, 5 backward.
    rp::Instruction& i = AddStep(
        rp::VECTOR, forward ? "layer_norm_rows" : "layer_norm_backward_rows",
        forward ? in : std::vector<std::string>(in.begin(), in.begin() + 5), outs, source,
        forward ? 3 : 5);
    i.set_m(cols == 0 ? 0 : Elements(x) / cols);
    i.set_n(cols);
    if (forward) i.set_scalar(AttrNumber(n, "eps", 1e-5));
  }

  // nll_loss_forward (log-probabilities [N, C], targets [N] -> loss, total
  // weight) and nll_loss_backward (grad, log-probabilities, targets, total
  // weight -> grad [N, C]); no class weights, mean or sum reduction.
  void LowerNllLoss(const proto::Node& n, const std::vector<std::string>& in,
                    const std::string& where, const std::string& source) {
    const bool forward = n.op() == "aten.nll_loss_forward";
    NEURON_CHECK(
        in.size() == (forward ? 2u : 4u) && n.outputs_size() == (forward ? 2 : 1), where,
        ": supported without class weights");
    const std::int64_t reduction = AttrInt(n, "reduction", 1);
    NEURON_CHECK(reduction >= 0 && reduction <= 2, where,
                 ": reduction ", reduction, " is none (0), mean (1) or sum (2)");
    const auto& logp = slots_.at(in[forward ? 0 : 1]).value.type();
    NEURON_CHECK(logp.shape_size() == 2, where, ": supported for [N, C] inputs");
    const std::vector<std::string> outs = AddOutputSlots(n, where);
    rp::Instruction& i = AddStep(
        rp::VECTOR, forward ? "nll_loss_rows" : "nll_loss_backward_rows",
        forward ? in : std::vector<std::string>{in[0], in[2], in[3]}, outs, source, 1);
    i.set_m(logp.shape(0));
    i.set_n(logp.shape(1));
    i.set_k(AttrInt(n, "ignore_index", -100));
    i.set_scalar(static_cast<double>(reduction));
    i.set_elements(Elements(logp));  // over the log-probabilities, not the loss
  }

  // Fusion: a chain of elementwise steps, each reading the previous one's
  // result and nothing else reading it, becomes one "fused" instruction
  // (on the scalar engine when it holds an activation, as the hardware's
  // activation instruction takes a scale and a bias; else on the vector
  // engine): the intermediates never go to SBUF, and the engine pays one
  // dependency overhead and reads only the chain's outside operands. A
  // matmul's epilogue (bias add, activation, residual add) is such a chain
  // from the PSUM evacuation on.
  static bool Fusible(const Step& s) {
    static const std::set<std::string> kOps = {
        "copy", "relu", "neg", "abs", "sign", "exp", "tanh", "sigmoid", "gelu", "gelu_exact", "scale",
        "add_scalar", "add", "sub", "mul", "div", "max", "min", "gelu_backward",
        "gelu_exact_backward", "threshold_backward", "tanh_backward", "sigmoid_backward"};
    const auto engine = s.instruction.engine();
    return (engine == rp::VECTOR || engine == rp::SCALAR) && s.writes.size() == 1 &&
           !s.reads.empty() && s.reads.size() <= 2 && kOps.count(s.instruction.op()) > 0;
  }

  void FuseElementwise() {
    std::unordered_map<std::string, int> readers;
    for (const auto& s : steps_) {
      for (const auto& r : s.reads) ++readers[r];
    }
    // The steps kept so far; a producer moved into a chain leaves an empty
    // place (dropped at the end), so indices stay valid. `writers` indexes
    // them by what they write, so finding a producer is not a scan.
    FusionState f;
    std::unordered_set<std::string> fused_away;  // intermediates that left SBUF
    for (auto& step : steps_) {
      if (Fusible(step)) {
        // The producer of one of its operands, if that operand is read
        // nowhere else: it moves down here (its inputs were ready before).
        for (const auto& x : step.reads) {
          const int p = Producer(f, x);
          if (p < 0 || readers[x] != 1 || slots_.at(x).space != rp::SBUF ||
              std::count(step.reads.begin(), step.reads.end(), x) != 1 ||
              f.out[p].instruction.elements() != step.instruction.elements() ||
              Elements(slots_.at(x).value.type()) != step.instruction.elements()) {
            continue;
          }
          Step chain = std::move(f.out[p]);
          f.live[p] = false;
          f.writers[x].pop_back();  // p was its latest writer
          if (chain.instruction.op() != "fused") chain = Fused(std::move(chain));
          AppendFused(chain, step, x);
          fused_away.insert(x);
          step = std::move(chain);
          break;
        }
      }
      for (const auto& w : step.writes) f.writers[w].push_back(static_cast<int>(f.out.size()));
      f.out.push_back(std::move(step));
      f.live.push_back(true);
    }
    steps_.clear();
    for (std::size_t i = 0; i < f.out.size(); ++i) {
      if (f.live[i]) steps_.push_back(std::move(f.out[i]));
    }
    order_.erase(std::remove_if(order_.begin(), order_.end(),
                                [&](const std::string& v) { return fused_away.count(v) > 0; }),
                 order_.end());
  }

  struct FusionState {
    std::vector<Step> out;
    std::vector<bool> live;
    std::unordered_map<std::string, std::vector<int>> writers;  // live writers, ascending
  };

  // The index in f.out of the fusible (or fused) step that writes `x` last
  // and only `x`, when no later step writes what it reads (it may move down
  // past them); else -1.
  static int Producer(const FusionState& f, const std::string& x) {
    const auto latest = [&](const std::string& name) {
      auto it = f.writers.find(name);
      return it == f.writers.end() || it->second.empty() ? -1 : it->second.back();
    };
    const int p = latest(x);
    if (p < 0) return -1;
    const Step& s = f.out[p];
    if (s.writes.size() != 1 || (s.instruction.op() != "fused" && !Fusible(s))) return -1;
    for (const auto& r : s.reads) {
      if (latest(r) > p) return -1;
    }
    return p;
  }

  // A one-op fused step (the head of a chain).
  Step Fused(Step head) {
    Step f;
    f.instruction.set_engine(head.instruction.engine());
    f.instruction.set_op("fused");
    f.instruction.set_elements(head.instruction.elements());
    f.instruction.set_source(head.instruction.source());
    f.reads = head.reads;
    f.writes = head.writes;
    f.instruction.set_operand_count(static_cast<std::uint32_t>(head.reads.size()));
    rp::Instruction sub = head.instruction;
    sub.clear_inputs();
    f.instruction.add_fused()->Swap(&sub);
    f.fused_reads.push_back(head.reads);
    return f;
  }

  // `next` reads the chain's result `x`: it joins the chain, and `x` goes.
  void AppendFused(Step& chain, const Step& next, const std::string& x) {
    rp::Instruction sub = next.instruction;
    sub.clear_inputs();
    std::vector<std::string> reads;
    for (const auto& r : next.reads) {
      reads.push_back(r == x ? std::string() : r);  // "": the previous result
      if (r != x && std::find(chain.reads.begin(), chain.reads.end(), r) == chain.reads.end()) {
        chain.reads.push_back(r);
      }
      if (r != x) chain.instruction.set_operand_count(chain.instruction.operand_count() + 1);
    }
    if (sub.engine() == rp::SCALAR) chain.instruction.set_engine(rp::SCALAR);  // the activation engine
    chain.instruction.add_fused()->Swap(&sub);
    chain.fused_reads.push_back(std::move(reads));
    chain.writes = next.writes;
    chain.instruction.set_source(next.instruction.source());
  }

  void Store(const std::string& name) {
    proto::Value v =
        slots_.count(name) ? slots_.at(name).value : slots_.at("hbm:" + name).value;
    const std::string target = "out:" + name;
    if (slots_.count(target)) return;  // returned twice: one buffer
    AddSlot(target, v, rp::HBM, "output");
    Dma("store", slots_.count(name) ? name : "hbm:" + name, target, "return %" + name);
  }

  // Lifetimes of the on-chip slots, by step, split by memory.
  void Lifetimes(std::vector<Interval>* sbuf, std::vector<Interval>* psum) const {
    std::map<std::string, Interval> life;
    for (int s = 0; s < static_cast<int>(steps_.size()); ++s) {
      for (const auto& w : steps_[s].writes) {
        if (slots_.at(w).space != rp::HBM && !life.count(w))
          life[w] = {w, slots_.at(w).bytes, s, s};
      }
      for (const auto& r : steps_[s].reads) {
        if (life.count(r)) life[r].last = s;
      }
    }
    sbuf->clear();
    psum->clear();
    for (const auto& [name, interval] : life) {
      (slots_.at(name).space == rp::PSUM ? psum : sbuf)->push_back(interval);
    }
  }

  // Spilling: when the SBUF plan does not fit, the largest value alive but
  // unused at the step where most bytes are alive goes to HBM right after
  // it is written (a "spill" DMA) and comes back before each later read (a
  // "reload" DMA into a fresh slot), so its bytes are free in between.
  // False when no value can go.
  bool SpillOne(const std::vector<Interval>& sbuf) {
    std::vector<std::uint64_t> alive(steps_.size(), 0);
    for (const auto& v : sbuf) {
      for (int s = v.first; s <= v.last; ++s) alive[static_cast<std::size_t>(s)] += v.bytes;
    }
    const int peak = static_cast<int>(std::max_element(alive.begin(), alive.end()) - alive.begin());
    const Interval* victim = nullptr;
    for (const auto& v : sbuf) {
      if (v.first >= peak || v.last <= peak || v.name.rfind(".reload", std::string::npos) !=
                                                     std::string::npos) {
        continue;
      }
      int writers = 0;
      bool used_at_peak = false;
      for (std::size_t s = 0; s < steps_.size(); ++s) {
        const auto& st = steps_[s];
        const bool writes = std::count(st.writes.begin(), st.writes.end(), v.name) > 0;
        writers += writes ? 1 : 0;
        if (static_cast<int>(s) == peak) {
          used_at_peak = writes || std::count(st.reads.begin(), st.reads.end(), v.name) > 0;
        }
      }
      if (writers == 1 && !used_at_peak && (victim == nullptr || v.bytes > victim->bytes)) {
        victim = &v;
      }
    }
    if (victim == nullptr) return false;
    const std::string name = victim->name;
    const std::string home = "spill:" + name;
    AddSlot(home, slots_.at(name).value, rp::HBM, "spill");
    std::vector<Step> out;
    int reloads = 0;
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      Step step = std::move(steps_[s]);
      const bool reads = std::count(step.reads.begin(), step.reads.end(), name) > 0;
      const bool writes = std::count(step.writes.begin(), step.writes.end(), name) > 0;
      if (reads && !writes) {  // bring it back for this step
        const std::string copy = StrCat(name, ".reload", reloads++);
        proto::Value v = slots_.at(name).value;
        v.set_name(copy);
        AddSlot(copy, v, rp::SBUF, "reload");
        Dma("reload", home, copy, "reload %" + name);
        steps_.back().instruction.set_spill(true);
        out.push_back(std::move(steps_.back()));
        steps_.pop_back();
        for (auto& r : step.reads) {
          if (r == name) r = copy;
        }
        for (auto& group : step.fused_reads) {
          for (auto& r : group) {
            if (r == name) r = copy;
          }
        }
      }
      out.push_back(std::move(step));
      if (writes) {  // and out, once written
        Dma("spill", name, home, "spill %" + name);
        steps_.back().instruction.set_spill(true);
        out.push_back(std::move(steps_.back()));
        steps_.pop_back();
      }
    }
    steps_ = std::move(out);
    return true;
  }

  Lowered Emit(const std::string& graph_id) {
    Lowered out;
    std::vector<Interval> sbuf, psum;
    while (true) {
      Lifetimes(&sbuf, &psum);
      try {
        out.sbuf = PlanMemory(sbuf, device_.SbufBytes(), kAlignment, "SBUF");
        break;
      } catch (const InvalidUsage&) {
        if (!SpillOne(sbuf)) throw;
      }
    }
    out.psum = PlanMemory(psum, device_.PsumBytes(), kAlignment, "PSUM");
    // HBM: no reuse.
    std::uint64_t hbm = 0;
    auto& e = out.executable;
    e.set_format_version(runtime::kExecutableFormatVersion);
    e.set_graph_id(graph_id);
    e.set_name(g_.name());
    e.set_compiler_version(kCompilerVersion);
    e.set_device(device_.spec().name());
    std::unordered_map<std::string, std::pair<std::uint64_t, std::uint64_t>> range;
    for (const auto& name : order_) {
      const Slot& s = slots_.at(name);
      std::uint64_t offset;
      if (s.space == rp::HBM) {
        offset = hbm;
        hbm += (s.bytes + kAlignment - 1) / kAlignment * kAlignment;
      } else {
        offset = (s.space == rp::PSUM ? out.psum : out.sbuf).offsets.at(name);
      }
      range[name] = {offset, offset + s.bytes};
      auto* b = e.add_buffers();
      b->set_id(s.buffer);
      b->set_name(name);
      b->set_space(s.space);
      b->set_offset(offset);
      b->set_bytes(s.bytes);
      b->set_dtype(s.dtype);
      for (auto d : s.value.type().shape()) b->add_shape(d);
    }
    // Dependencies: data, and reuse of the same bytes.
    auto overlaps = [&](const std::string& a, const std::string& b) {
      if (slots_.at(a).space != slots_.at(b).space) return false;
      return range[a].first < range[b].second && range[b].first < range[a].second;
    };
    TransitiveReduction reduction;
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      rp::Instruction* in = e.add_instructions();
      *in = steps_[s].instruction;
      in->set_id(static_cast<std::uint32_t>(s));
      for (const auto& r : steps_[s].reads) in->add_inputs(slots_.at(r).buffer);
      for (const auto& w : steps_[s].writes) in->add_outputs(slots_.at(w).buffer);
      for (std::size_t k = 0; k < steps_[s].fused_reads.size(); ++k) {
        for (const auto& r : steps_[s].fused_reads[k]) {
          in->mutable_fused(static_cast<int>(k))
              ->add_inputs(r.empty() ? runtime::kFusedPrevious : slots_.at(r).buffer);
        }
      }
      std::vector<std::uint32_t> deps;
      for (std::size_t p = 0; p < s; ++p) {
        for (const auto& w : steps_[p].writes) {  // read-after-write, write-after-write
          for (const auto& r : steps_[s].reads)
            if (overlaps(w, r)) deps.push_back(static_cast<std::uint32_t>(p));
          for (const auto& x : steps_[s].writes)
            if (overlaps(w, x)) deps.push_back(static_cast<std::uint32_t>(p));
        }
        for (const auto& r : steps_[p].reads) {  // write-after-read
          for (const auto& x : steps_[s].writes)
            if (overlaps(r, x)) deps.push_back(static_cast<std::uint32_t>(p));
        }
      }
      for (auto d : reduction.Direct(std::move(deps))) in->add_deps(d);
    }
    for (const auto& v : g_.inputs()) {
      auto* b = e.add_inputs();
      b->set_name(v.name());
      b->set_buffer(slots_.at("hbm:" + v.name()).buffer);
    }
    for (const auto& c : g_.constants()) {
      auto* k = e.add_constants();
      k->set_buffer(slots_.at("hbm:" + c.value().name()).buffer);
      k->set_data(c.data());
    }
    for (const auto& name : g_.outputs()) {
      auto* b = e.add_outputs();
      b->set_name(name);
      b->set_buffer(slots_.at("out:" + name).buffer);
    }
    return out;
  }

  const proto::Graph& g_;
  const runtime::DeviceSpec& device_;
  std::unordered_map<std::string, Slot> slots_;
  std::vector<std::string> order_;  // slots in creation order (buffer ids)
  std::vector<Step> steps_;
};

}  // namespace

Lowered Lower(const proto::Graph& graph, const runtime::DeviceSpec& device,
              const std::string& graph_id) {
  return Lowering(graph, device).Run(graph_id);
}

}  // namespace neuron::compiler
