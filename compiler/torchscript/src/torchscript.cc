#include "neuron/compiler/torchscript.h"

#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "neuron/compiler/native_ops.h"
#include "neuron/compiler/torch_tensors.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

using torch::jit::Node;
using torch::jit::Value;

// The IR op for an aten op: "aten.add" for aten::add.Tensor, the overload
// kept where it names a different op ("aten.sum.dim_IntList"), as the
// Python frontend names them.
std::string IrOpName(const Node* n) {
  const auto& schema = n->schema();
  std::string name = "aten." + schema.name().substr(schema.name().find("::") + 2);
  const std::string& overload = schema.overload_name();
  if (!overload.empty() && overload != "Tensor" && overload != "default") name += "." + overload;
  return name;
}

class Translator {
 public:
  Translator(std::shared_ptr<torch::jit::Graph> graph, const std::string& name)
      : graph_(std::move(graph)) {
    out_.set_name(name);
  }

  proto::Graph Run(const std::vector<at::Tensor>& examples) {
    const auto inputs = graph_->inputs();
    NEURON_CHECK(inputs.size() == examples.size() + 1, "TorchScript: forward takes ",
                 inputs.size() - 1, " inputs, ", examples.size(), " examples were given");
    for (std::size_t i = 0; i < examples.size(); ++i) {
      const std::string name = "input" + std::to_string(i);
      NEURON_CHECK(examples[i].defined(), "TorchScript: example ", i, " is undefined");
      values_[inputs[i + 1]] = examples[i];
      *out_.add_inputs() = TypeOf(name, examples[i], "input " + name);
      names_[inputs[i + 1]] = name;
    }
    for (Node* n : graph_->nodes()) Translate(n);
    Value* result = graph_->outputs().at(0);
    std::vector<Value*> returned;
    if (result->node()->kind() == c10::prim::TupleConstruct) {
      for (Value* v : result->node()->inputs()) returned.push_back(v);
    } else {
      returned.push_back(result);
    }
    for (Value* v : returned) out_.add_outputs(TensorName(v, "the result"));
    return out_;
  }

 private:
  static std::string Where(const Node* n) {
    std::string where = StrCat("TorchScript node ", n->kind().toQualString());
    if (auto loc = n->sourceRange().file_line_col()) {
      where += StrCat(" at ", std::get<0>(*loc), ":", std::get<1>(*loc));
    }
    return where;
  }

  proto::Value TypeOf(const std::string& name, const at::Tensor& t, const std::string& where) {
    proto::Value v;
    v.set_name(name);
    v.mutable_type()->set_dtype(IrDtypeOf(t.scalar_type(), where));
    for (auto d : t.sizes()) v.mutable_type()->add_shape(d);
    return v;
  }

  // Evaluates `n` on the values seen so far (the examples): every output's
  // value, so shapes and integer arithmetic are known.
  std::vector<c10::IValue> Evaluate(Node* n) {
    if (n->kind() == c10::prim::Constant) return {torch::jit::toIValue(n->output()).value()};
    if (n->kind() == c10::prim::ListConstruct || n->kind() == c10::prim::TupleConstruct) {
      std::vector<c10::IValue> items;
      for (Value* v : n->inputs()) items.push_back(values_.at(v));
      if (n->kind() == c10::prim::TupleConstruct) return {c10::ivalue::Tuple::create(items)};
      auto all = [&](auto is) { return std::all_of(items.begin(), items.end(), is); };
      if (!items.empty() && all([](const c10::IValue& v) { return v.isInt(); })) {
        c10::List<std::int64_t> list;
        for (const auto& v : items) list.push_back(v.toInt());
        return {list};
      }
      if (!items.empty() && all([](const c10::IValue& v) { return v.isTensor(); })) {
        c10::List<at::Tensor> list;
        for (const auto& v : items) list.push_back(v.toTensor());
        return {list};
      }
      if (!items.empty() && all([](const c10::IValue& v) { return v.isDouble(); })) {
        c10::List<double> list;
        for (const auto& v : items) list.push_back(v.toDouble());
        return {list};
      }
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& v : items) list.push_back(v);
      return {list};
    }
    if (n->kind() == c10::prim::ListUnpack) {
      const auto list = values_.at(n->input()).toListRef();
      return std::vector<c10::IValue>(list.begin(), list.end());
    }
    torch::jit::Stack stack;
    for (Value* v : n->inputs()) stack.push_back(values_.at(v));
    n->getOperation()(stack);
    return {stack.begin(), stack.end()};
  }

  // The IR name of a tensor value; a constant tensor becomes an IR constant.
  std::string TensorName(Value* v, const std::string& where) {
    if (auto it = names_.find(v); it != names_.end()) return it->second;
    const c10::IValue& value = values_.at(v);
    NEURON_CHECK(value.isTensor(), where, ": expects a tensor");
    at::Tensor t = value.toTensor().contiguous();
    // A traced Python number (x / 5.66) is a 0-dim double tensor, which
    // does not promote the other operand: float32 on the device.
    if (t.dim() == 0 && t.scalar_type() == at::kDouble) t = t.to(at::kFloat);
    const std::string name = "c" + std::to_string(names_.size());
    auto* c = out_.add_constants();
    *c->mutable_value() = TypeOf(name, t, where);
    c->set_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
    return names_[v] = name;
  }

  std::string NewName() { return "v" + std::to_string(next_++); }

  proto::Node* AddNode(const std::string& op, const std::vector<std::string>& inputs,
                       const std::string& source) {
    auto* node = out_.add_nodes();
    node->set_op(op);
    for (const auto& i : inputs) node->add_inputs(i);
    node->set_source(source);
    return node;
  }

  // A node with one tensor output of `result`'s type; returns its name.
  std::string Emit(const std::string& op, const std::vector<std::string>& inputs,
                   const at::Tensor& result, const std::string& where,
                   const std::map<std::string, proto::Attribute>& attrs = {}) {
    auto* node = AddNode(op, inputs, where);
    const std::string name = NewName();
    *node->add_outputs() = TypeOf(name, result, where);
    for (const auto& [k, v] : attrs) (*node->mutable_attrs())[k] = v;
    return name;
  }

  static proto::Attribute Ints(c10::IntArrayRef values) {
    proto::Attribute a;
    for (auto v : values) a.mutable_ints()->add_values(v);
    return a;
  }

  static proto::Attribute Int(std::int64_t v) {
    proto::Attribute a;
    a.set_i(v);
    return a;
  }

  // A non-tensor argument as an attribute; false for None and arguments
  // the IR leaves implied (dtype, layout, device, memory format, pin_memory).
  static bool ToAttribute(const c10::IValue& v, const std::string& arg, proto::Attribute* a) {
    if (v.isNone() || arg == "dtype" || arg == "layout" || arg == "device" ||
        arg == "memory_format" || arg == "pin_memory") {
      return false;
    }
    if (v.isBool()) {
      a->set_i(v.toBool() ? 1 : 0);
    } else if (v.isInt()) {
      a->set_i(v.toInt());
    } else if (v.isDouble()) {
      a->set_f(v.toDouble());
    } else if (v.isString()) {
      a->set_s(v.toStringRef());
    } else if (v.isIntList()) {
      *a = Ints(v.toIntVector());
    } else if (v.isBoolList()) {
      for (bool b : v.toBoolList()) a->mutable_ints()->add_values(b ? 1 : 0);
    } else {
      return false;
    }
    return true;
  }

  // The parts of aten::chunk or aten::split (a list the graph unpacks):
  // one slice each along the dim, at the offsets their sizes give.
  void UnpackParts(Node* n, const std::string& where) {
    Node* list = n->input()->node();
    const std::string op = list->kind().toUnqualString();
    NEURON_CHECK(list->kind().is_aten() && (op == "chunk" || op == "split"), where,
                 ": unpacks the result of ", list->kind().toQualString(),
                 "; the device takes chunk and split");
    const std::string whole = TensorName(list->inputs()[0], where);
    const auto rank = values_.at(list->inputs()[0]).toTensor().dim();
    std::int64_t dim = values_.at(list->inputs()[2]).toInt();
    if (dim < 0) dim += rank;
    std::int64_t start = 0;
    for (Value* part : n->outputs()) {
      const at::Tensor t = values_.at(part).toTensor();
      const std::int64_t size = t.size(dim);
      names_[part] = Emit("aten.slice", {whole}, t, where,
                          {{"dim", Int(dim)}, {"start", Int(start)}, {"end", Int(start + size)},
                           {"step", Int(1)}});
      start += size;
    }
  }

  // Input `i` of `n`: its known value, its IR name (a tensor), its shape.
  const c10::IValue& Input(Node* n, std::size_t i) const { return values_.at(n->inputs()[i]); }
  std::string TensorInput(Node* n, std::size_t i, const std::string& where) {
    return TensorName(n->inputs()[i], where);
  }
  c10::IntArrayRef ShapeOf(Node* n, std::size_t i) const { return Input(n, i).toTensor().sizes(); }

  void Translate(Node* n) {
    const auto results = Evaluate(n);
    for (std::size_t i = 0; i < n->outputs().size() && i < results.size(); ++i) {
      values_[n->outputs()[i]] = results[i];
    }
    const bool tensor_result =
        n->outputs().size() >= 1 && results.size() >= 1 && results[0].isTensor();
    const auto kind = n->kind();
    if (kind == c10::prim::Constant || !tensor_result || kind == c10::prim::TupleConstruct ||
        kind == c10::prim::ListConstruct) {
      return;  // numbers, lists, tuples: known values, used as attributes
    }
    const std::string where = Where(n);
    if (kind == c10::prim::ListUnpack) {
      UnpackParts(n, where);
      return;
    }
    NEURON_CHECK(kind.is_aten(), where, ": is not supported on the device");
    names_[n->outputs()[0]] = TranslateAten(n, results[0].toTensor(), where);
  }

  // The IR name of aten node `n`'s result `result`: its composite ops
  // (dropout in eval, contiguous, view, softmax, layer_norm, linear,
  // matmul) by hand, the rest by name.
  std::string TranslateAten(Node* n, const at::Tensor& result, const std::string& where) {
    const std::string op = n->kind().toUnqualString();
    if (op == "dropout" || op == "feature_dropout") {
      NEURON_CHECK(!Input(n, 2).toBool(), where, ": dropout in training mode (call .eval() "
                   "before saving, or compile it from Python)");
      return TensorInput(n, 0, where);
    }
    if (op == "contiguous") return Emit("aten.clone", {TensorInput(n, 0, where)}, result, where);
    if (op == "view" || op == "reshape" || op == "flatten") {
      return Emit("aten.view", {TensorInput(n, 0, where)}, result, where,
                  {{"size", Ints(result.sizes())}});
    }
    if (op == "softmax" || op == "log_softmax") {
      return Emit(op == "softmax" ? "aten._softmax" : "aten._log_softmax",
                  {TensorInput(n, 0, where)}, result, where,
                  {{"dim", Int(Input(n, 1).toInt())}, {"half_to_float", Int(0)}});
    }
    if (op == "layer_norm") return TranslateLayerNorm(n, result, where);
    if (op == "linear") return TranslateLinear(n, result, where);
    if (op == "matmul") return TranslateMatmul(n, result, where);
    return TranslateByName(n, result, where);
  }

  // layer_norm (x, normalized_shape, weight, bias, eps, cudnn).
  std::string TranslateLayerNorm(Node* n, const at::Tensor& result, const std::string& where) {
    NEURON_CHECK(!Input(n, 2).isNone() && !Input(n, 3).isNone(), where,
                 ": layer_norm needs weight and bias on the device");
    auto* node = AddNode("aten.native_layer_norm",
                         {TensorInput(n, 0, where), TensorInput(n, 2, where),
                          TensorInput(n, 3, where)},
                         where);
    const std::string y = NewName();
    *node->add_outputs() = TypeOf(y, result, where);
    std::vector<std::int64_t> stats(ShapeOf(n, 0).begin(), ShapeOf(n, 0).end());
    stats.back() = 1;
    const at::Tensor stat = at::empty(stats, result.options().dtype(at::kFloat));
    *node->add_outputs() = TypeOf(NewName(), stat, where);
    *node->add_outputs() = TypeOf(NewName(), stat, where);
    (*node->mutable_attrs())["normalized_shape"] = Ints(Input(n, 1).toIntVector());
    proto::Attribute eps;
    eps.set_f(Input(n, 4).toDouble());
    (*node->mutable_attrs())["eps"] = eps;
    return y;
  }

  // linear: x [.., K] x weight [N, K]^T + bias, the rows through one mm.
  std::string TranslateLinear(Node* n, const at::Tensor& result, const std::string& where) {
    const auto x = ShapeOf(n, 0), w = ShapeOf(n, 1);
    const std::int64_t rows = Input(n, 0).toTensor().numel() / x.back();
    const at::Tensor wt = at::empty({w[1], w[0]}, result.options());
    const std::string weight_t = Emit("aten.t", {TensorInput(n, 1, where)}, wt, where);
    std::string input = TensorInput(n, 0, where);
    const at::Tensor flat_out = at::empty({rows, w[0]}, result.options());
    if (x.size() != 2) {
      input = Emit("aten.view", {input}, at::empty({rows, x.back()}, result.options()), where,
                   {{"size", Ints({rows, x.back()})}});
    }
    std::string y =
        Input(n, 2).isNone()
            ? Emit("aten.mm", {input, weight_t}, flat_out, where)
            : Emit("aten.addmm", {TensorInput(n, 2, where), input, weight_t}, flat_out, where);
    if (x.size() != 2) y = Emit("aten.view", {y}, result, where, {{"size", Ints(result.sizes())}});
    return y;
  }

  // matmul: mm, bmm, or [.., K] x [K, N] as rows through one mm.
  std::string TranslateMatmul(Node* n, const at::Tensor& result, const std::string& where) {
    const auto a = ShapeOf(n, 0), b = ShapeOf(n, 1);
    const bool batched = a.size() == 3 && b.size() == 3 && a[0] == b[0];
    if ((a.size() == 2 && b.size() == 2) || batched) {
      const std::string lhs = TensorInput(n, 0, where);
      return Emit(batched ? "aten.bmm" : "aten.mm", {lhs, TensorInput(n, 1, where)}, result,
                  where);
    }
    NEURON_CHECK(b.size() == 2, where, ": matmul of ", a.size(), "-D and ", b.size(),
                 "-D tensors is not supported on the device");
    const std::int64_t rows = Input(n, 0).toTensor().numel() / a.back();
    const std::string flat =
        Emit("aten.view", {TensorInput(n, 0, where)},
             at::empty({rows, a.back()}, result.options()), where,
             {{"size", Ints({rows, a.back()})}});
    const std::string mm = Emit("aten.mm", {flat, TensorInput(n, 1, where)},
                                at::empty({rows, b[1]}, result.options()), where);
    return Emit("aten.view", {mm}, result, where, {{"size", Ints(result.sizes())}});
  }

  // Any other op by name, if the device runs it: tensors in order, other
  // arguments as attributes named by the op's schema.
  std::string TranslateByName(Node* n, const at::Tensor& result, const std::string& where) {
    const std::string name = IrOpName(n);
    NEURON_CHECK(IsNativeOp(name), where, ": ", name, " is not supported on the device (",
                 NotNativeReason(name), ")");
    std::vector<std::string> tensors;
    std::map<std::string, proto::Attribute> attrs;
    const auto& args = n->schema().arguments();
    for (std::size_t i = 0; i < n->inputs().size(); ++i) {
      const c10::IValue& v = Input(n, i);
      const std::string arg = i < args.size() ? args[i].name() : StrCat("arg", i);
      if (v.isTensor()) {
        tensors.push_back(TensorInput(n, i, where));
      } else if (v.isTensorList()) {
        Node* list = n->inputs()[i]->node();
        for (Value* item : list->inputs()) tensors.push_back(TensorName(item, where));
      } else {
        proto::Attribute a;
        if (ToAttribute(v, arg, &a)) attrs[arg] = a;
      }
    }
    NEURON_CHECK(n->outputs().size() == 1, where, ": ", name, " has ", n->outputs().size(),
                 " outputs; one is supported here");
    return Emit(name, tensors, result, where, attrs);
  }

  std::shared_ptr<torch::jit::Graph> graph_;
  proto::Graph out_;
  std::unordered_map<const Value*, c10::IValue> values_;
  std::unordered_map<const Value*, std::string> names_;
  int next_ = 0;
};

}  // namespace

proto::Graph GraphFromTorchScript(const std::string& path, const std::vector<at::Tensor>& examples,
                                  const std::string& name) {
  torch::jit::Module module;
  try {
    module = torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw IoError(StrCat("cannot load TorchScript module ", path, ": ",
                         e.what_without_backtrace()));
  }
  module.eval();
  torch::jit::Module frozen = torch::jit::freeze_module(module);
  auto graph = frozen.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  torch::NoGradGuard no_grad;
  return Translator(graph, name).Run(examples);
}

}  // namespace neuron::compiler
