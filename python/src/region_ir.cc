#include "region_ir.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "neuron/compiler/native_ops.h"
#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"

namespace neuron::python {
namespace {

namespace ad = aten::adaptive;

// Ops written out as other IR ops (Writer::Op).
const std::set<std::string>& WrittenOut() {
  static const std::set<std::string> ops = {"lerp", "addcmul", "addcdiv", "fill", "zero"};
  return ops;
}

bool IsCopy(const aten::OpInfo& info) { return info.name == "aten::_copy_from"; }

// The IR's dtype name; empty for a dtype it lacks.
std::string IrDtype(at::ScalarType type) {
  switch (type) {
#define NEURON_IR_NAME(Id, bytes, floating, name, ir, Torch, Device) \
  case at::ScalarType::Torch:                                        \
    return ir;
    NEURON_FORALL_DTYPES(NEURON_IR_NAME)
#undef NEURON_IR_NAME
    default:
      return "";
  }
}

bool IsFloat(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

std::string Ints(c10::ArrayRef<std::int64_t> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string Type(at::ScalarType dtype, c10::ArrayRef<std::int64_t> sizes) {
  std::string s = IrDtype(dtype) + "[";
  for (std::size_t i = 0; i < sizes.size(); ++i)
    s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string Number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::vector<std::int64_t> Contiguous(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> s(sizes.size());
  std::int64_t step = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    s[i] = step;
    step *= sizes[i];
  }
  return s;
}

bool IsContiguous(const ad::TensorRef& r) {
  const auto want = Contiguous(r.sizes);
  for (std::size_t i = 0; i < r.sizes.size(); ++i) {
    if (r.sizes[i] != 1 && r.strides[i] != want[i]) return false;
  }
  return true;
}

std::int64_t Numel(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 1;
  for (auto d : sizes) n *= d;
  return n;
}

// For a tensor laid out densely in another order than its dims' (a
// transpose of a contiguous tensor): its dims in memory order; empty for a
// contiguous one, one with a size-1 dim, or one that is not dense
// (torchneuron/fx_to_ir.py _stored_order).
std::vector<std::int64_t> StoredOrder(const ad::TensorRef& r) {
  const std::size_t n = r.sizes.size();
  if (n < 2) return {};
  for (auto d : r.sizes) {
    if (d < 2) return {};
  }
  std::vector<std::int64_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return r.strides[a] > r.strides[b];
  });
  std::int64_t expected = 1;
  for (std::size_t k = n; k-- > 0;) {
    if (r.strides[order[k]] != expected) return {};
    expected *= r.sizes[order[k]];
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (order[i] != static_cast<std::int64_t>(i)) return order;
  }
  return {};
}

std::vector<std::int64_t> Inverse(const std::vector<std::int64_t>& order) {
  std::vector<std::int64_t> inv(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    inv[order[i]] = static_cast<std::int64_t>(i);
  return inv;
}

// The translation of one region.
class Writer {
 public:
  explicit Writer(const std::string& name) : name_(name) {}
  void Op(std::size_t index, const ad::QueuedOp& op);
  std::string Text() const;

 private:
  struct Produced {
    std::string name;
    const ad::TensorRef* ref;  // the region's (or made_'s)
    bool input = false;        // a region input's contiguous form: never returned
  };
  struct View {
    const ad::TensorRef* ref;
    std::string name;
  };
  // The value `r` reads now, or null.
  const std::string* Find(const ad::TensorRef& r) const;
  std::string Operand(const ad::TensorRef& r);
  std::string Derived(const ad::TensorRef& r);
  std::string Input(const ad::TensorRef& r);
  std::string Scalar(double v);
  std::string Fresh() { return "%v" + std::to_string(next_++); }
  void Line(const std::string& results, const std::string& op,
            const std::vector<std::string>& operands,
            const std::vector<std::string>& attrs);
  // Names result `r` of the op just written: the latest value of its memory.
  std::string Result(const ad::TensorRef& r);
  // Records `name` as the latest value of `r`'s memory, `r` its view.
  void Base(const std::string& name, const ad::TensorRef& r, bool input);
  void Functional(const ad::QueuedOp& op, const std::string& ir_op);
  void WriteOut(const ad::QueuedOp& op, const std::string& base);
  bool ScaledAdd(const ad::QueuedOp& op, const std::string& base);
  std::vector<std::string> Operands(const ad::Argument& a);
  double Value(const ad::Argument& a, double otherwise) const;

  std::string name_;
  int next_ = 0;
  int inputs_made_ = 0;
  std::vector<std::string> inputs_;
  std::vector<std::string> lines_;
  // Memory -> the values its views hold now (a write clears them).
  std::unordered_map<const void*, std::vector<View>> current_;
  std::unordered_map<const void*, std::size_t> latest_;  // memory -> produced_ index
  std::deque<ad::TensorRef> made_;  // the views the writer makes (stable addresses)
  std::vector<Produced> produced_;
  std::string where_;
};

void Writer::Line(const std::string& results, const std::string& op,
                  const std::vector<std::string>& operands,
                  const std::vector<std::string>& attrs) {
  std::string s = "  " + results + " = " + op + "(";
  for (std::size_t i = 0; i < operands.size(); ++i) s += (i ? ", " : "") + operands[i];
  s += ")";
  if (!attrs.empty()) {
    s += " {";
    for (std::size_t i = 0; i < attrs.size(); ++i) s += (i ? ", " : "") + attrs[i];
    s += "}";
  }
  lines_.push_back(s + "  # " + where_);
}

std::string Writer::Input(const ad::TensorRef& r) {
  NEURON_CHECK(!IrDtype(r.dtype).empty(), where_, ": an input of dtype ",
               c10::toString(r.dtype), " the IR lacks");
  const std::string name = "%in" + std::to_string(inputs_made_++);
  const auto order = StoredOrder(r);
  if (order.empty()) {
    inputs_.push_back(name + ": " + Type(r.dtype, r.sizes));
    if (IsContiguous(r)) Base(name, r, /*input=*/true);
    return name;
  }
  std::vector<std::int64_t> stored;
  for (auto d : order) stored.push_back(r.sizes[d]);
  inputs_.push_back(name + "_stored: " + Type(r.dtype, stored));
  // Its memory read as stored (the contiguous tensor it is a view of).
  ad::TensorRef& base = made_.emplace_back(r);
  base.sizes = stored;
  base.strides = Contiguous(stored);
  Base(name + "_stored", base, /*input=*/true);
  Line(name + ": " + Type(r.dtype, r.sizes), "aten.permute", {name + "_stored"},
       {"dims = " + Ints(Inverse(order))});
  return name;
}

std::string Writer::Scalar(double) {
  const std::string name = "%in" + std::to_string(inputs_made_++);
  inputs_.push_back(name + ": f32[]");
  return name;
}

// A view of the latest value of `r`'s memory (written in the region, or a
// contiguous input): a reshape of it, or a dense permutation; empty when
// `r` is neither.
std::string Writer::Derived(const ad::TensorRef& r) {
  auto it = latest_.find(r.key);
  if (it == latest_.end()) return "";
  const Produced& p = produced_[it->second];
  const ad::TensorRef& base = *p.ref;
  if (Find(base) == nullptr || !IsContiguous(base) || base.offset != r.offset ||
      base.dtype != r.dtype || Numel(base.sizes) != Numel(r.sizes)) {
    return "";
  }
  const std::string name = Fresh();
  const std::string type = Type(r.dtype, r.sizes);
  if (IsContiguous(r)) {
    Line(name + ": " + type, "aten.view", {p.name}, {"size = " + Ints(r.sizes)});
    return name;
  }
  const auto order = StoredOrder(r);
  std::vector<std::int64_t> stored;
  for (auto d : order) stored.push_back(r.sizes[d]);
  if (order.empty() || stored != base.sizes) {
    --next_;
    return "";
  }
  Line(name + ": " + type, "aten.permute", {p.name}, {"dims = " + Ints(Inverse(order))});
  return name;
}

std::string Writer::Operand(const ad::TensorRef& r) {
  if (r.key == nullptr) {  // a CPU number (a wrapped scalar)
    NEURON_CHECK(r.sizes.empty(), where_, ": a CPU tensor of ", r.sizes.size(), " dims");
    return Scalar(0);
  }
  if (const std::string* now = Find(r)) return *now;
  std::string name = Derived(r);
  if (name.empty()) name = Input(r);
  current_[r.key].push_back({&r, name});
  return name;
}

const std::string* Writer::Find(const ad::TensorRef& r) const {
  const auto it = current_.find(r.key);
  if (it == current_.end()) return nullptr;
  for (const View& v : it->second) {
    if (v.ref->SameView(r)) return &v.name;
  }
  return nullptr;
}

std::string Writer::Result(const ad::TensorRef& r) {
  NEURON_CHECK(r.defined && !IrDtype(r.dtype).empty(), where_,
               ": a result the IR cannot type");
  const std::string name = Fresh();
  current_[r.key].clear();  // earlier views of this memory are stale: it was written
  Base(name, r, /*input=*/false);
  return name;
}

void Writer::Base(const std::string& name, const ad::TensorRef& r, bool input) {
  std::vector<View>& views = current_[r.key];
  views.erase(std::remove_if(views.begin(), views.end(),
                             [&](const View& v) { return v.ref->SameView(r); }),
              views.end());
  views.push_back({&r, name});
  latest_[r.key] = produced_.size();
  produced_.push_back({name, &r, input});
}

std::vector<std::string> Writer::Operands(const ad::Argument& a) {
  std::vector<std::string> out;
  for (const auto& t : a.tensors) out.push_back(Operand(t));
  return out;
}

double Writer::Value(const ad::Argument& a, double otherwise) const {
  if (a.kind != ad::Argument::Kind::kValue) return otherwise;
  NEURON_CHECK(a.value.isScalar(), where_, ": a number argument expected");
  return a.value.toScalar().toDouble();
}

// An attribute `arg = value`; empty for a value every IR value satisfies
// (layout, memory format, device, pin_memory) or that is left at its
// default (alpha = 1).
std::string Attribute(const c10::Argument& arg, const c10::IValue& v,
                      const std::string& where) {
  c10::TypePtr type = arg.real_type();  // ScalarType, not the int it travels as
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  const auto kind = type->kind();
  if (kind == c10::TypeKind::LayoutType || kind == c10::TypeKind::MemoryFormatType ||
      kind == c10::TypeKind::DeviceObjType || arg.name() == "pin_memory" ||
      arg.name() == "non_blocking") {
    return "";
  }
  if (kind == c10::TypeKind::ScalarTypeType) {
    const std::string ir = IrDtype(static_cast<at::ScalarType>(v.toInt()));
    NEURON_CHECK(!ir.empty(), where, ": dtype argument the IR lacks");
    return arg.name() + " = \"" + ir + "\"";
  }
  if (arg.name() == "alpha" && v.isScalar() && v.toScalar().toDouble() == 1.0) return "";
  if (v.isBool()) return arg.name() + " = " + (v.toBool() ? "1" : "0");
  if (v.isInt()) return arg.name() + " = " + std::to_string(v.toInt());
  if (v.isDouble()) return arg.name() + " = " + Number(v.toDouble());
  if (v.isString()) return arg.name() + " = \"" + v.toStringRef() + "\"";
  if (v.isIntList()) return arg.name() + " = " + Ints(v.toIntVector());
  if (v.isBoolList()) {
    std::vector<std::int64_t> bits;
    for (bool b : v.toBoolList()) bits.push_back(b ? 1 : 0);
    return arg.name() + " = " + Ints(bits);
  }
  NEURON_CHECK(false, where, ": argument ", arg.name(), " (", v.tagKind(),
               ") has no IR attribute form");
  return "";
}

// A native op as itself: tensors as operands, other arguments as
// attributes named by the schema; an out= argument is its result.
void Writer::Functional(const ad::QueuedOp& op, const std::string& ir_op) {
  const auto& args =
      static_cast<const c10::FunctionSchema*>(op.info->schema)->arguments();
  std::vector<std::string> operands, attrs;
  for (std::size_t i = 0; i < args.size() && i < op.arguments.size(); ++i) {
    const ad::Argument& a = op.arguments[i];
    if (args[i].is_out()) continue;
    if (a.kind == ad::Argument::Kind::kValue) {
      std::string attr = Attribute(args[i], a.value, where_);
      if (!attr.empty()) attrs.push_back(std::move(attr));
    } else {
      for (std::string& o : Operands(a)) operands.push_back(std::move(o));
    }
  }
  std::string results;
  for (const ad::TensorRef& r : op.results) {
    results += (results.empty() ? "" : ", ") + Result(r) + ": " + Type(r.dtype, r.sizes);
  }
  Line(results, ir_op, operands, attrs);
}

// lerp, addcmul, addcdiv as elementwise ops; fill_ and zero_ as full and
// zeros. Their number arguments are f32[] inputs.
void Writer::WriteOut(const ad::QueuedOp& op, const std::string& base) {
  NEURON_CHECK(op.results.size() == 1, where_, ": one result expected");
  const ad::TensorRef& r = op.results[0];
  const std::string type = Type(r.dtype, r.sizes);
  if (base == "fill" || base == "zero") {
    NEURON_CHECK(base == "zero" || op.arguments[1].kind == ad::Argument::Kind::kValue,
                 where_, ": fill_ with a tensor value");
    const double value = base == "zero" ? 0.0 : Value(op.arguments[1], 0.0);
    const std::string dtype = "dtype = \"" + IrDtype(r.dtype) + "\"";
    std::vector<std::string> attrs = {"size = " + Ints(r.sizes), dtype};
    if (base == "fill") attrs.insert(attrs.begin() + 1, "fill_value = " + Number(value));
    Line(Result(r) + ": " + type, base == "fill" ? "aten.full" : "aten.zeros", {}, attrs);
    return;
  }
  const std::string self = Operand(op.arguments[0].tensors.at(0));
  const std::string a = Operand(op.arguments[1].tensors.at(0));
  const ad::Argument& third = op.arguments[2];
  std::string term = Fresh();
  if (base == "lerp") {  // self + weight * (end - self)
    Line(term + ": " + type, "aten.sub", {a, self}, {});
    const std::string w = third.kind == ad::Argument::Kind::kTensor
                              ? Operand(third.tensors.at(0))
                              : Scalar(Value(third, 0.0));
    const std::string scaled = Fresh();
    Line(scaled + ": " + type, "aten.mul", {term, w}, {});
    term = scaled;
  } else {  // self + value * (t1 * t2) or (t1 / t2)
    const std::string b = Operand(third.tensors.at(0));
    Line(term + ": " + type, base == "addcmul" ? "aten.mul" : "aten.div", {a, b}, {});
    if (op.arguments.size() > 3 && Value(op.arguments[3], 1.0) != 1.0) {
      const std::string scaled = Fresh();
      Line(scaled + ": " + type, "aten.mul", {term, Scalar(Value(op.arguments[3], 1.0))},
           {});
      term = scaled;
    }
  }
  Line(Result(r) + ": " + type, "aten.add", {self, term}, {});
}

// add and sub with alpha other than 1 (SGD's update, alpha = -lr): the
// device's add takes alpha 1, so other * alpha (an f32[] input) first.
bool Writer::ScaledAdd(const ad::QueuedOp& op, const std::string& base) {
  if ((base != "add" && base != "sub") || op.arguments.size() < 3 ||
      op.arguments[2].kind != ad::Argument::Kind::kValue ||
      Value(op.arguments[2], 1.0) == 1.0 || op.results.size() != 1) {
    return false;
  }
  const ad::TensorRef& r = op.results[0];
  const std::string type = Type(r.dtype, r.sizes);
  const std::string self = Operand(op.arguments[0].tensors.at(0));
  const std::string other = Operand(op.arguments[1].tensors.at(0));
  const std::string scaled = Fresh();
  Line(scaled + ": " + type, "aten.mul", {other, Scalar(Value(op.arguments[2], 1.0))},
       {});
  Line(Result(r) + ": " + type, "aten." + base, {self, scaled}, {});
  return true;
}

void Writer::Op(std::size_t index, const ad::QueuedOp& op) {
  where_ = "region op " + std::to_string(index) + " (" + op.info->name + ")";
  if (IsCopy(*op.info)) {
    const std::string source = Operand(op.arguments.at(0).tensors.at(0));
    const ad::TensorRef& r = op.results.at(0);
    Line(Result(r) + ": " + Type(r.dtype, r.sizes), "aten.clone", {source}, {});
  } else if (WrittenOut().count(op.info->base) != 0) {
    WriteOut(op, op.info->base);
  } else if (!ScaledAdd(op, op.info->base)) {
    Functional(op, "aten." + op.info->base);
  }
}

// The graph: inputs in order of first use, the values written whose memory
// something still holds as results (else the last op's, so that the plan
// has work to time).
std::string Writer::Text() const {
  std::vector<std::string> returned;
  for (const Produced& p : produced_) {
    const std::string* now = Find(*p.ref);
    if (!p.input && now != nullptr && *now == p.name && p.ref->held) {
      returned.push_back(p.name);
    }
  }
  if (returned.empty() && !produced_.empty()) returned.push_back(produced_.back().name);
  std::ostringstream out;
  out << "graph " << name_ << "(";
  for (std::size_t i = 0; i < inputs_.size(); ++i) out << (i ? ", " : "") << inputs_[i];
  out << ") {\n";
  for (const std::string& line : lines_) out << line << "\n";
  out << "  return ";
  for (std::size_t i = 0; i < returned.size(); ++i) out << (i ? ", " : "") << returned[i];
  out << "\n}\n";
  return out.str();
}

}  // namespace

bool RegionTakesRun(const aten::OpInfo& info, const std::vector<ad::Argument>& arguments,
                    c10::ArrayRef<at::Tensor> results) {
  if (results.empty()) return false;
  for (const at::Tensor& t : results) {
    if (!t.defined() || !IsFloat(t.scalar_type())) return false;
  }
  if (IsCopy(info)) {
    return !arguments.empty() && arguments[0].tensors.size() == 1 &&
           arguments[0].tensors[0].dtype == results[0].scalar_type();
  }
  return true;
}

bool RegionExpressesOp(const aten::OpInfo& info) {
  return IsCopy(info) || WrittenOut().count(info.base) != 0 ||
         compiler::IsNativeOp("aten." + info.base);
}

std::string RegionToIr(const ad::Region& region, const std::string& name) {
  Writer w(name);
  for (std::size_t i = 0; i < region.ops.size(); ++i) w.Op(i, region.ops[i]);
  return w.Text();
}

}  // namespace neuron::python
