#include "neuron/compiler/lower.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "neuron/compiler/passes.h"
#include "neuron/runtime/device/executor.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

namespace rp = runtime::proto;

constexpr std::uint64_t kAlignment = 64;

rp::ElementType ElementTypeOf(const std::string& dtype, const std::string& where) {
  static const std::map<std::string, rp::ElementType> kTypes = {
      {"f32", rp::F32}, {"bf16", rp::BF16}, {"f16", rp::F16}, {"i64", rp::I64},
      {"i32", rp::I32}, {"i8", rp::I8},     {"u8", rp::U8},   {"bool", rp::BOOL}};
  auto it = kTypes.find(dtype);
  NEURON_CHECK(
      it != kTypes.end(), where, ": dtype ", dtype,
      " is not supported on the device (float32, bfloat16, float16 and integers are)");
  return it->second;
}

std::int64_t Elements(const proto::TensorType& t) {
  std::int64_t n = 1;
  for (auto d : t.shape()) n *= d;
  return n;
}

// A value of the program and where it lives.
struct Slot {
  proto::Value value;
  rp::MemorySpace space = rp::SBUF;
  rp::ElementType dtype = rp::F32;
  std::uint64_t bytes = 0;
  std::uint32_t buffer = 0;
};

// An instruction before placement: values by slot name.
struct Step {
  rp::Instruction instruction;  // engine, op, cost parameters, source
  std::vector<std::string> reads, writes;
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
    return Emit(graph_id);
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
    s.dtype = ElementTypeOf(v.type().dtype(), where);
    s.bytes =
        static_cast<std::uint64_t>(Elements(v.type())) * runtime::ElementBytes(s.dtype);
    s.buffer = static_cast<std::uint32_t>(slots_.size());
    order_.push_back(name);
    return slots_[name] = s;
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

  void Elementwise(rp::EngineKind engine, const std::string& op,
                   std::vector<std::string> reads, const std::string& write,
                   const std::string& source) {
    Step s;
    s.instruction.set_engine(engine);
    s.instruction.set_op(op);
    s.instruction.set_elements(Elements(slots_.at(write).value.type()));
    s.instruction.set_operand_count(static_cast<std::uint32_t>(reads.size()));
    s.instruction.set_source(source);
    s.reads = std::move(reads);
    s.writes = {write};
    steps_.push_back(std::move(s));
  }

  void LowerNode(int i, const proto::Node& n) {
    const std::string where = Where(i, n);
    const std::string source = n.source().empty() ? n.op() : n.source();
    std::vector<std::string> in;
    for (const auto& name : n.inputs()) in.push_back(OnChip(name));
    auto attr = [&](const char* key) -> const proto::Attribute* {
      auto it = n.attrs().find(key);
      return it == n.attrs().end() ? nullptr : &it->second;
    };
    const std::string& op = n.op();
    if (op == "aten.native_layer_norm" || op == "aten.native_layer_norm_backward") {
      LowerLayerNorm(n, in, where, source);
      return;
    }
    if (op == "aten.nll_loss_forward" || op == "aten.nll_loss_backward") {
      LowerNllLoss(n, in, where, source);
      return;
    }
    NEURON_CHECK(n.outputs_size() == 1, where, ": is not supported on the device (",
                 n.outputs_size(), " outputs)");
    const proto::Value& out = n.outputs(0);
    if (op == "aten.mm" || op == "aten.addmm") {
      // addmm(bias, a, b) = a x b + bias: the matmul, then a vector add.
      const bool addmm = op == "aten.addmm";
      NEURON_CHECK(in.size() == (addmm ? 3u : 2u), where, ": takes ", addmm ? 3 : 2,
                   " inputs");
      if (addmm) {
        for (const char* key : {"alpha", "beta"}) {
          if (const auto* a = attr(key)) {
            const double v = a->value_case() == proto::Attribute::kF ? a->f() : a->i();
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
      const bool direct = out.type().dtype() == "f32" && !addmm;
      proto::Value acc = out;
      acc.mutable_type()->set_dtype("f32");
      const std::string target = direct ? out.name() : out.name() + ".psum";
      AddSlot(target, acc, rp::PSUM, where);
      Step s;
      s.instruction.set_engine(rp::TENSOR);
      s.instruction.set_op("matmul");
      s.instruction.set_m(a.shape(0));
      s.instruction.set_k(a.shape(1));
      s.instruction.set_n(b.shape(1));
      s.instruction.set_source(source);
      s.reads = {lhs, rhs};
      s.writes = {target};
      steps_.push_back(std::move(s));
      if (!direct) {
        AddSlot(out.name(), out, rp::SBUF, where);
        if (addmm) {
          const std::int64_t nb = Elements(slots_.at(in[0]).value.type());
          NEURON_CHECK(nb > 0 && Elements(out.type()) % nb == 0, where,
                       ": the bias must be [N] or [M,N]");
          Elementwise(rp::VECTOR, "add", {target, in[0]}, out.name(), source);
        } else {
          Elementwise(rp::VECTOR, "copy", {target}, out.name(), source);
        }
      }
      return;
    }
    static const std::map<std::string, std::string> kBinary = {{"aten.add", "add"},
                                                               {"aten.sub", "sub"},
                                                               {"aten.mul", "mul"},
                                                               {"aten.maximum", "max"},
                                                               {"aten.minimum", "min"}};
    static const std::map<std::string, std::pair<rp::EngineKind, std::string>> kUnary = {
        {"aten.relu", {rp::VECTOR, "relu"}},       {"aten.neg", {rp::VECTOR, "neg"}},
        {"aten.exp", {rp::SCALAR, "exp"}},         {"aten.tanh", {rp::SCALAR, "tanh"}},
        {"aten.sigmoid", {rp::SCALAR, "sigmoid"}}, {"aten.gelu", {rp::SCALAR, "gelu"}}};
    AddSlot(out.name(), out, rp::SBUF, where);
    static const std::set<std::string> kCopies = {"aten.view",    "aten._unsafe_view",
                                                  "aten.reshape", "aten.detach",
                                                  "aten.clone",   "aten.alias"};
    if (kCopies.count(op)) {  // the same elements in row-major order
      NEURON_CHECK(
          !in.empty() && Elements(slots_.at(in[0]).value.type()) == Elements(out.type()),
          where, ": changes the number of elements");
      Elementwise(rp::VECTOR, "copy", {in[0]}, out.name(), source);
      return;
    }
    if (op == "aten.t" || op == "aten.sum.dim_IntList") {
      NEURON_CHECK(in.size() == 1, where, ": takes one input");
      const auto& t = slots_.at(in[0]).value.type();
      NEURON_CHECK(t.shape_size() == 2, where, ": supported for 2-D tensors only");
      if (op == "aten.sum.dim_IntList") {
        const auto* dim = attr("dim");
        const bool rows = dim != nullptr && dim->ints().values_size() == 1 &&
                          (dim->ints().values(0) == 0 || dim->ints().values(0) == -2);
        NEURON_CHECK(rows, where, ": supported over dim [0] only");
        NEURON_CHECK(Elements(out.type()) == t.shape(1), where, ": the sum of a [",
                     t.shape(0), ", ", t.shape(1), "] tensor over dim 0 has ", t.shape(1),
                     " elements, the graph says ", Elements(out.type()));
      } else {
        NEURON_CHECK(out.type().shape_size() == 2 && out.type().shape(0) == t.shape(1) &&
                         out.type().shape(1) == t.shape(0),
                     where, ": the transpose of a [", t.shape(0), ", ", t.shape(1),
                     "] tensor is [", t.shape(1), ", ", t.shape(0), "]");
      }
      Elementwise(rp::VECTOR, op == "aten.t" ? "transpose" : "sum_rows", {in[0]},
                  out.name(), source);
      steps_.back().instruction.set_m(t.shape(0));
      steps_.back().instruction.set_n(t.shape(1));
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
      const auto* threshold = attr("threshold");
      Elementwise(rp::VECTOR, "threshold_backward", in, out.name(), source);
      steps_.back().instruction.set_scalar(
          threshold == nullptr                              ? 0.0
          : threshold->value_case() == proto::Attribute::kF ? threshold->f()
                                                            : threshold->i());
      return;
    }
    if (auto b = kBinary.find(op); b != kBinary.end()) {
      NEURON_CHECK(in.size() == 2, where, ": takes two inputs");
      if (const auto* alpha = attr("alpha")) {
        const double a =
            alpha->value_case() == proto::Attribute::kF ? alpha->f() : alpha->i();
        NEURON_CHECK(a == 1.0, where, ": alpha ", a,
                     " is not supported on the device (only 1)");
      }
      const std::int64_t n0 = Elements(slots_.at(in[0]).value.type());
      const std::int64_t n1 = Elements(slots_.at(in[1]).value.type());
      const std::int64_t total = Elements(out.type());
      NEURON_CHECK(n0 == total && n1 > 0 && total % n1 == 0, where,
                   ": broadcasting is supported for the second operand only (", n0,
                   " and ", n1, " elements into ", total, ")");
      Elementwise(rp::VECTOR, b->second, in, out.name(), source);
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
    if (!forward) {
      auto mask = n.attrs().find("output_mask");
      bool all = mask != n.attrs().end() && mask->second.ints().values_size() == 3;
      for (int k = 0; all && k < 3; ++k) all = mask->second.ints().values(k) != 0;
      NEURON_CHECK(all, where, ": supported when all three gradients are wanted");
    }
    const std::int64_t cols = x.shape(x.shape_size() - 1);
    for (const auto& out : n.outputs()) AddSlot(out.name(), out, rp::SBUF, where);
    Step s;
    s.instruction.set_engine(rp::VECTOR);
    s.instruction.set_op(forward ? "layer_norm_rows" : "layer_norm_backward_rows");
    s.instruction.set_m(cols == 0 ? 0 : Elements(x) / cols);
    s.instruction.set_n(cols);
    s.instruction.set_elements(Elements(x));
    s.instruction.set_operand_count(forward ? 3 : 5);  // passes over each row
    if (forward) {
      auto eps = n.attrs().find("eps");
      s.instruction.set_scalar(eps == n.attrs().end() ? 1e-5 : eps->second.f());
    }
    s.instruction.set_source(source);
    s.reads = forward ? in : std::vector<std::string>(in.begin(), in.begin() + 5);
    for (const auto& out : n.outputs()) s.writes.push_back(out.name());
    steps_.push_back(std::move(s));
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
    auto attr_i = [&](const char* key, std::int64_t fallback) {
      auto it = n.attrs().find(key);
      return it == n.attrs().end() ? fallback : it->second.i();
    };
    const std::int64_t reduction = attr_i("reduction", 1);
    NEURON_CHECK(reduction == 1 || reduction == 2, where,
                 ": supported with reduction mean or sum, not ", reduction);
    const auto& logp = slots_.at(in[forward ? 0 : 1]).value.type();
    NEURON_CHECK(logp.shape_size() == 2, where, ": supported for [N, C] inputs");
    for (const auto& out : n.outputs()) AddSlot(out.name(), out, rp::SBUF, where);
    Step s;
    s.instruction.set_engine(rp::VECTOR);
    s.instruction.set_op(forward ? "nll_loss_rows" : "nll_loss_backward_rows");
    s.instruction.set_m(logp.shape(0));
    s.instruction.set_n(logp.shape(1));
    s.instruction.set_k(attr_i("ignore_index", -100));
    s.instruction.set_scalar(static_cast<double>(reduction));
    s.instruction.set_elements(Elements(logp));
    s.instruction.set_operand_count(1);
    s.instruction.set_source(source);
    s.reads = forward ? in : std::vector<std::string>{in[0], in[2], in[3]};
    for (const auto& out : n.outputs()) s.writes.push_back(out.name());
    steps_.push_back(std::move(s));
  }

  void Store(const std::string& name) {
    proto::Value v =
        slots_.count(name) ? slots_.at(name).value : slots_.at("hbm:" + name).value;
    const std::string target = "out:" + name;
    if (slots_.count(target)) return;  // returned twice: one buffer
    AddSlot(target, v, rp::HBM, "output");
    Dma("store", slots_.count(name) ? name : "hbm:" + name, target, "return %" + name);
  }

  Lowered Emit(const std::string& graph_id) {
    Lowered out;
    // Lifetimes of the on-chip slots, by step.
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
    std::vector<Interval> sbuf, psum;
    for (const auto& [name, interval] : life) {
      (slots_.at(name).space == rp::PSUM ? psum : sbuf).push_back(interval);
    }
    out.sbuf = PlanMemory(sbuf, device_.SbufBytes(), kAlignment, "SBUF");
    out.psum = PlanMemory(psum, device_.PsumBytes(), kAlignment, "PSUM");
    // HBM: no reuse.
    std::uint64_t hbm = 0;
    auto& e = out.executable;
    e.set_format_version(1);
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
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      rp::Instruction* in = e.add_instructions();
      *in = steps_[s].instruction;
      in->set_id(static_cast<std::uint32_t>(s));
      for (const auto& r : steps_[s].reads) in->add_inputs(slots_.at(r).buffer);
      for (const auto& w : steps_[s].writes) in->add_outputs(slots_.at(w).buffer);
      std::set<std::uint32_t> deps;
      for (std::size_t p = 0; p < s; ++p) {
        for (const auto& w : steps_[p].writes) {  // read-after-write, write-after-write
          for (const auto& r : steps_[s].reads)
            if (overlaps(w, r)) deps.insert(p);
          for (const auto& x : steps_[s].writes)
            if (overlaps(w, x)) deps.insert(p);
        }
        for (const auto& r : steps_[p].reads) {  // write-after-read
          for (const auto& x : steps_[s].writes)
            if (overlaps(r, x)) deps.insert(p);
        }
      }
      for (auto d : deps) in->add_deps(d);
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
