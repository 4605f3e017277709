#include "neuron/compiler/passes.h"

#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "neuron/runtime/dtype_list.h"
#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

// The IR's dtypes: every one of runtime/dtype_list.h.
const std::set<std::string> kDtypes = {
#define NEURON_IR_DTYPE(Id, bytes, floating, name, ir, Torch, Device) ir,
    NEURON_FORALL_DTYPES(NEURON_IR_DTYPE)
#undef NEURON_IR_DTYPE
};

std::string Where(const proto::Graph& g, int index, const proto::Node& n) {
  return StrCat("graph ", g.name(), ": node ", index, " (", n.op(), ")",
                n.source().empty() ? "" : " from " + n.source());
}

void CheckType(const proto::Value& v, const std::string& where) {
  NEURON_CHECK(kDtypes.count(v.type().dtype()), where, ": %", v.name(),
               " has unknown dtype '", v.type().dtype(), "'");
  for (auto d : v.type().shape()) {
    NEURON_CHECK(d >= 0, where, ": %", v.name(), " has a negative dimension ", d);
  }
}

using Nodes = google::protobuf::RepeatedPtrField<proto::Node>;

// Takes the nodes out of `g` (left with none), so a pass can move the ones
// it keeps back without copying the rest of the graph.
Nodes TakeNodes(proto::Graph& g) {
  Nodes nodes;
  nodes.Swap(g.mutable_nodes());
  return nodes;
}

// Replaces the uses of value `from` by `to` in nodes[first..] and `outputs`.
void RenameUses(Nodes& nodes, int first, google::protobuf::RepeatedPtrField<std::string>& outputs,
                const std::string& from, const std::string& to) {
  for (int j = first; j < nodes.size(); ++j) {
    for (auto& in : *nodes.Mutable(j)->mutable_inputs()) {
      if (in == from) in = to;
    }
  }
  for (auto& out : outputs) {
    if (out == from) out = to;
  }
}

std::int64_t Elements(const proto::TensorType& t) {
  std::int64_t n = 1;
  for (auto d : t.shape()) n *= d;
  return n;
}

std::vector<float> Floats(const proto::Constant& c) {
  std::vector<float> v(c.data().size() / 4);
  std::memcpy(v.data(), c.data().data(), v.size() * 4);
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

double AttrF(const proto::Node& n, const std::string& key, double fallback) {
  auto it = n.attrs().find(key);
  if (it == n.attrs().end()) return fallback;
  return it->second.value_case() == proto::Attribute::kF
             ? it->second.f()
             : static_cast<double>(it->second.i());
}

// The folded value of `n` over constant operands, or false.
bool Evaluate(const proto::Node& n, const std::vector<const proto::Constant*>& in,
              std::vector<float>& out) {
  if (n.outputs_size() != 1 || n.outputs(0).type().dtype() != "f32") return false;
  for (const auto* c : in) {
    if (c->value().type().dtype() != "f32") return false;
  }
  const std::int64_t size = Elements(n.outputs(0).type());
  out.assign(size, 0.0f);
  const std::string& op = n.op();
  if ((op == "aten.view" || op == "aten.reshape") && in.size() >= 1) {
    out = Floats(*in[0]);
    return static_cast<std::int64_t>(out.size()) == size;
  }
  if (op == "aten.t" && in.size() == 1 && in[0]->value().type().shape_size() == 2) {
    const auto a = Floats(*in[0]);
    const std::int64_t r = in[0]->value().type().shape(0),
                       c = in[0]->value().type().shape(1);
    for (std::int64_t i = 0; i < r; ++i) {
      for (std::int64_t j = 0; j < c; ++j) out[j * r + i] = a[i * c + j];
    }
    return true;
  }
  if ((op == "aten.neg" || op == "aten.relu") && in.size() == 1) {
    const auto a = Floats(*in[0]);
    if (static_cast<std::int64_t>(a.size()) != size) return false;
    for (std::int64_t i = 0; i < size; ++i)
      out[i] = op == "aten.neg" ? -a[i] : (a[i] > 0 ? a[i] : 0);
    return true;
  }
  if ((op == "aten.add" || op == "aten.sub" || op == "aten.mul") && in.size() == 2) {
    const auto a = Floats(*in[0]), b = Floats(*in[1]);
    auto at = [size](const std::vector<float>& v, std::int64_t i) {
      return v.size() == 1 ? v[0] : v[i];
    };
    for (const auto* v : {&a, &b}) {
      if (v->size() != 1 && static_cast<std::int64_t>(v->size()) != size) return false;
    }
    const float alpha = static_cast<float>(AttrF(n, "alpha", 1.0));
    for (std::int64_t i = 0; i < size; ++i) {
      const float x = at(a, i), y = at(b, i);
      out[i] = op == "aten.add"   ? x + alpha * y
               : op == "aten.sub" ? x - alpha * y
                                  : x * y;
    }
    return true;
  }
  return false;
}

}  // namespace

bool HasSideEffects(const proto::Node& n) {
  const std::string& op = n.op();
  return op.find("dropout") != std::string::npos ||
         op.find("rand") != std::string::npos ||
         op.find("bernoulli") != std::string::npos || (!op.empty() && op.back() == '_');
}

void VerifyGraph(const proto::Graph& g) {
  std::unordered_set<std::string> defined;
  auto define = [&](const proto::Value& v, const std::string& where) {
    CheckType(v, where);
    NEURON_CHECK(defined.insert(v.name()).second, where, ": %", v.name(),
                 " is defined twice");
  };
  for (const auto& v : g.inputs()) define(v, StrCat("graph ", g.name(), ": input"));
  for (const auto& c : g.constants()) {
    const std::string where = StrCat("graph ", g.name(), ": constant");
    define(c.value(), where);
    if (c.value().type().dtype() == "f32") {
      NEURON_CHECK(
          static_cast<std::int64_t>(c.data().size()) == 4 * Elements(c.value().type()),
          where, " %", c.value().name(), " has ", c.data().size(), " bytes for ",
          Elements(c.value().type()), " f32 elements");
    }
  }
  for (int i = 0; i < g.nodes_size(); ++i) {
    const auto& n = g.nodes(i);
    const std::string where = Where(g, i, n);
    NEURON_CHECK(!n.op().empty(), where, ": no op");
    for (const auto& in : n.inputs()) {
      NEURON_CHECK(defined.count(in), where, ": uses %", in, " before it is defined");
    }
    NEURON_CHECK(n.outputs_size() > 0, where, ": defines no value");
    for (const auto& out : n.outputs()) define(out, where);
  }
  for (const auto& out : g.outputs()) {
    NEURON_CHECK(defined.count(out), "graph ", g.name(), ": returns %", out,
                 ", which is not defined");
  }
}

int EliminateDeadCode(proto::Graph& g) {
  std::unordered_set<std::string> live(g.outputs().begin(), g.outputs().end());
  std::vector<bool> keep(g.nodes_size(), false);
  for (int i = g.nodes_size() - 1; i >= 0; --i) {
    const auto& n = g.nodes(i);
    bool used = HasSideEffects(n);
    for (const auto& out : n.outputs()) used = used || live.count(out.name());
    if (!used) continue;
    keep[i] = true;
    for (const auto& in : n.inputs()) live.insert(in);
  }
  // Move the survivors back (constants carry their data: never copied).
  Nodes nodes = TakeNodes(g);
  for (int i = 0; i < nodes.size(); ++i) {
    if (keep[i]) *g.add_nodes() = std::move(*nodes.Mutable(i));
  }
  google::protobuf::RepeatedPtrField<proto::Constant> constants;
  constants.Swap(g.mutable_constants());
  for (auto& c : constants) {
    if (live.count(c.value().name())) *g.add_constants() = std::move(c);
  }
  return nodes.size() - g.nodes_size();
}

int EliminateCommonSubexpressions(proto::Graph& g) {
  std::unordered_map<std::string, int> seen;  // key -> index in g's nodes
  Nodes nodes = TakeNodes(g);
  int removed = 0;
  for (int i = 0; i < nodes.size(); ++i) {
    // Its inputs already name the survivors of earlier merges (the renames
    // below rewrite the nodes after a merged one and the outputs).
    proto::Node& n = *nodes.Mutable(i);
    std::string key;
    if (!HasSideEffects(n)) {
      proto::Node canonical = n;
      for (auto& o : *canonical.mutable_outputs()) o.clear_name();
      canonical.clear_source();
      std::map<std::string, proto::Attribute> sorted(n.attrs().begin(), n.attrs().end());
      canonical.clear_attrs();
      key = canonical.SerializeAsString();
      for (const auto& [k, v] : sorted) key += "|" + k + "=" + v.SerializeAsString();
      auto it = seen.find(key);
      if (it != seen.end()) {
        const proto::Node& earlier = g.nodes(it->second);
        for (int o = 0; o < n.outputs_size(); ++o) {
          RenameUses(nodes, i + 1, *g.mutable_outputs(), n.outputs(o).name(),
                     earlier.outputs(o).name());
        }
        ++removed;
        continue;
      }
    }
    *g.add_nodes() = std::move(n);
    if (!key.empty()) seen[key] = g.nodes_size() - 1;
  }
  return removed;
}

int FoldConstants(proto::Graph& g) {
  int folded = 0;
  std::unordered_map<std::string, int> constant;  // name -> index in g.constants
  for (int i = 0; i < g.constants_size(); ++i) constant[g.constants(i).value().name()] = i;
  Nodes nodes = TakeNodes(g);
  for (auto& n : nodes) {
    std::vector<const proto::Constant*> in;
    bool all = !HasSideEffects(n);
    for (const auto& name : n.inputs()) {
      auto it = constant.find(name);
      if (it == constant.end()) {
        all = false;
        break;
      }
      in.push_back(&g.constants(it->second));
    }
    std::vector<float> value;
    if (all && !in.empty() && Evaluate(n, in, value)) {
      auto* c = g.add_constants();
      *c->mutable_value() = n.outputs(0);
      c->set_data(Bytes(value));
      constant[n.outputs(0).name()] = g.constants_size() - 1;
      ++folded;
      continue;
    }
    *g.add_nodes() = std::move(n);
  }
  return folded;
}

}  // namespace neuron::compiler

namespace neuron::compiler {

namespace {

// The permutation a layout op applies to its input's dims (out dim d is
// input dim perm[d]), or empty when `n` is none of t, transpose.int and
// permute.
std::vector<std::int64_t> Permutation(const proto::Node& n, std::size_t rank) {
  std::vector<std::int64_t> perm(rank);
  for (std::size_t d = 0; d < rank; ++d) perm[d] = static_cast<std::int64_t>(d);
  auto normal = [&](std::int64_t d) { return d < 0 ? d + static_cast<std::int64_t>(rank) : d; };
  if (n.op() == "aten.t" && rank == 2) {
    std::swap(perm[0], perm[1]);
  } else if (n.op() == "aten.transpose.int") {
    auto a = n.attrs().find("dim0"), b = n.attrs().find("dim1");
    if (a == n.attrs().end() || b == n.attrs().end()) return {};
    const auto x = normal(a->second.i()), y = normal(b->second.i());
    if (x < 0 || y < 0 || x >= static_cast<std::int64_t>(rank) ||
        y >= static_cast<std::int64_t>(rank)) {
      return {};
    }
    std::swap(perm[static_cast<std::size_t>(x)], perm[static_cast<std::size_t>(y)]);
  } else if (n.op() == "aten.permute") {
    auto dims = n.attrs().find("dims");
    if (dims == n.attrs().end() ||
        dims->second.ints().values_size() != static_cast<int>(rank)) {
      return {};
    }
    for (std::size_t d = 0; d < rank; ++d) perm[d] = normal(dims->second.ints().values(d));
  } else {
    return {};
  }
  return perm;
}

// Value name -> its rank (number of dims).
using Ranks = std::unordered_map<std::string, std::size_t>;

// The ranks of the graph's inputs and constants; a pass adds each node's
// outputs (AddOutputRanks) as it walks the nodes.
Ranks InputRanks(const proto::Graph& g) {
  Ranks rank;
  for (const auto& v : g.inputs())
    rank[v.name()] = static_cast<std::size_t>(v.type().shape_size());
  for (const auto& c : g.constants()) {
    rank[c.value().name()] = static_cast<std::size_t>(c.value().type().shape_size());
  }
  return rank;
}

void AddOutputRanks(const proto::Node& n, Ranks& rank) {
  for (const auto& o : n.outputs())
    rank[o.name()] = static_cast<std::size_t>(o.type().shape_size());
}

}  // namespace

int FoldTransposes(proto::Graph& g) {
  // Value name -> (its producer's input, the permutation from it), for
  // values made by a layout op.
  std::unordered_map<std::string, std::pair<std::string, std::vector<std::int64_t>>> layout;
  Ranks rank = InputRanks(g);
  Nodes nodes = TakeNodes(g);
  int folded = 0;
  for (int i = 0; i < nodes.size(); ++i) {
    proto::Node& n = *nodes.Mutable(i);
    AddOutputRanks(n, rank);
    if (n.inputs_size() == 1 && n.outputs_size() == 1) {
      const std::string& in = n.inputs(0);
      auto perm = Permutation(n, rank.count(in) ? rank[in] : 0);
      if (!perm.empty()) {
        auto inner = layout.find(in);
        if (inner != layout.end()) {  // a layout op of a layout op: compose them
          std::vector<std::int64_t> composed(perm.size());
          for (std::size_t d = 0; d < perm.size(); ++d) {
            composed[d] = inner->second.second[static_cast<std::size_t>(perm[d])];
          }
          bool identity = true;
          for (std::size_t d = 0; d < composed.size(); ++d) {
            identity = identity && composed[d] == static_cast<std::int64_t>(d);
          }
          const std::string source = inner->second.first;
          if (identity) {  // t(t(x)) is x
            RenameUses(nodes, i + 1, *g.mutable_outputs(), n.outputs(0).name(), source);
            ++folded;
            continue;
          }
          // One permute of the original value instead of two layout ops.
          n.set_op("aten.permute");
          n.clear_attrs();
          proto::Attribute dims;
          for (auto d : composed) dims.mutable_ints()->add_values(d);
          (*n.mutable_attrs())["dims"] = dims;
          n.set_inputs(0, source);
          perm = composed;
          ++folded;
        }
        layout[n.outputs(0).name()] = {n.inputs(0), perm};
      }
    }
    *g.add_nodes() = std::move(n);
  }
  return folded;
}

int FoldTransposesIntoMatmuls(proto::Graph& g) {
  // Value name -> the value it is the matrix transpose of (its last two
  // dims swapped, the batch dim kept), for values a layout op made.
  std::unordered_map<std::string, std::string> transposed;
  Ranks rank = InputRanks(g);
  int folded = 0;
  for (auto& n : *g.mutable_nodes()) {
    AddOutputRanks(n, rank);
    if (n.inputs_size() == 1 && n.outputs_size() == 1) {
      const std::size_t r = rank.count(n.inputs(0)) ? rank[n.inputs(0)] : 0;
      const auto perm = Permutation(n, r);
      const bool matrix = (r == 2 && perm == std::vector<std::int64_t>{1, 0}) ||
                          (r == 3 && perm == std::vector<std::int64_t>{0, 2, 1});
      if (matrix) transposed[n.outputs(0).name()] = n.inputs(0);
      continue;
    }
    int lhs = -1;
    if (n.op() == "aten.mm" || n.op() == "aten.bmm") lhs = 0;
    if (n.op() == "aten.addmm") lhs = 1;
    if (lhs < 0 || n.inputs_size() != lhs + 2) continue;
    const char* keys[] = {"transpose_lhs", "transpose_rhs"};
    for (int side = 0; side < 2; ++side) {
      auto t = transposed.find(n.inputs(lhs + side));
      if (t == transposed.end() || n.attrs().count(keys[side])) continue;
      n.set_inputs(lhs + side, t->second);
      (*n.mutable_attrs())[keys[side]].set_i(1);
      ++folded;
    }
  }
  return folded;
}

}  // namespace neuron::compiler
