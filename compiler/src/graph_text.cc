#include "neuron/compiler/graph_text.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

std::string Float(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // n: nan, inf
  return s;
}

std::string Type(const proto::TensorType& t) {
  std::string s = t.dtype() + "[";
  for (int i = 0; i < t.shape_size(); ++i)
    s += (i ? "," : "") + std::to_string(t.shape(i));
  return s + "]";
}

std::string Value(const proto::Value& v) {
  return "%" + v.name() + ": " + Type(v.type());
}

std::string Attr(const proto::Attribute& a) {
  switch (a.value_case()) {
    case proto::Attribute::kI:
      return std::to_string(a.i());
    case proto::Attribute::kF:
      return Float(a.f());
    case proto::Attribute::kS:
      return "\"" + a.s() + "\"";
    case proto::Attribute::kInts: {
      std::string s = "[";
      for (int i = 0; i < a.ints().values_size(); ++i) {
        s += (i ? ", " : "") + std::to_string(a.ints().values(i));
      }
      return s + "]";
    }
    default:
      return "?";
  }
}

std::string ConstantData(const proto::Constant& c) {
  const std::string& d = c.data();
  if (c.value().type().dtype() == "f32" && d.size() % 4 == 0) {
    std::string s = "[";
    for (std::size_t i = 0; i < d.size(); i += 4) {
      float f;
      std::memcpy(&f, d.data() + i, 4);
      std::string v = Float(f);
      if (v.size() > 2 && v.compare(v.size() - 2, 2, ".0") == 0) v.resize(v.size() - 2);
      s += (i ? ", " : "") + v;
    }
    return s + "]";
  }
  static const char* hex = "0123456789abcdef";
  std::string s = "0x";
  for (unsigned char ch : d) s += std::string{hex[ch >> 4], hex[ch & 15]};
  return s;
}

// A small recursive-descent reader over the text form.
class Reader {
 public:
  Reader(const std::string& text, const std::string& origin)
      : t_(text), origin_(origin) {}

  proto::Graph Graph() {
    proto::Graph g;
    Word("graph");
    g.set_name(Identifier());
    Expect("(");
    if (!Peek(")")) {
      do *g.add_inputs() = ValueDecl();
      while (Accept(","));
    }
    Expect(")");
    Expect("{");
    while (true) {
      if (AcceptWord("return")) {
        do g.add_outputs(Ref());
        while (Accept(","));
        break;
      }
      if (AcceptWord("const")) {
        auto* c = g.add_constants();
        *c->mutable_value() = ValueDecl();
        Expect("=");
        c->set_data(Data(c->value().type().dtype()));
        continue;
      }
      Node(g.add_nodes());
    }
    Expect("}");
    Skip();
    if (p_ != t_.size()) Fail("text after the graph's closing brace");
    return g;
  }

 private:
  void Node(proto::Node* n) {
    do *n->add_outputs() = ValueDecl();
    while (Accept(","));
    Expect("=");
    n->set_op(OpName());
    Expect("(");
    if (!Peek(")")) {
      do n->add_inputs(Ref());
      while (Accept(","));
    }
    Expect(")");
    const std::size_t after_inputs = p_;
    if (Accept("{")) {
      do {
        const std::string key = Identifier();
        Expect("=");
        (*n->mutable_attrs())[key] = Attribute();
      } while (Accept(","));
      Expect("}");
    } else {
      p_ = after_inputs;  // back before the line's comment, which Accept skipped
    }
    n->set_source(TrailingComment());
  }

  // The comment that ends a node's line ("  # File "train.py", line 7"),
  // trimmed: the node's source, which errors name. "" when there is none.
  std::string TrailingComment() {
    std::size_t q = p_;
    while (q < t_.size() && (t_[q] == ' ' || t_[q] == '\t')) ++q;
    if (q >= t_.size() || t_[q] != '#') return "";
    std::size_t end = t_.find('\n', q);
    if (end == std::string::npos) end = t_.size();
    std::size_t first = q + 1, last = end;
    while (first < last && std::isspace(static_cast<unsigned char>(t_[first]))) ++first;
    while (last > first && std::isspace(static_cast<unsigned char>(t_[last - 1]))) --last;
    p_ = end;
    return t_.substr(first, last - first);
  }

  proto::Attribute Attribute() {
    proto::Attribute a;
    Skip();
    if (Accept("\"")) {
      const std::size_t end = t_.find('"', p_);
      if (end == std::string::npos) Fail("an unterminated string");
      a.set_s(t_.substr(p_, end - p_));
      p_ = end + 1;
    } else if (Accept("[")) {
      auto* ints = a.mutable_ints();
      if (!Peek("]")) {
        do ints->add_values(Integer());
        while (Accept(","));
      }
      Expect("]");
    } else {
      if (NextIsReal()) {
        a.set_f(Real());
      } else {
        a.set_i(Integer());
      }
    }
    return a;
  }

  std::string Data(const std::string& dtype) {
    Skip();
    if (t_.compare(p_, 2, "0x") == 0) {
      p_ += 2;
      std::string bytes;
      while (p_ + 1 < t_.size() && std::isxdigit(t_[p_]) && std::isxdigit(t_[p_ + 1])) {
        bytes += static_cast<char>(std::stoi(t_.substr(p_, 2), nullptr, 16));
        p_ += 2;
      }
      return bytes;
    }
    if (dtype != "f32")
      Fail("constant data of dtype " + dtype + " as 0x followed by hex bytes");
    Expect("[");
    std::string bytes;
    if (!Peek("]")) {
      do {
        const float f = static_cast<float>(Real());
        bytes.append(reinterpret_cast<const char*>(&f), 4);
      } while (Accept(","));
    }
    Expect("]");
    return bytes;
  }

  proto::Value ValueDecl() {
    proto::Value v;
    v.set_name(Ref());
    Expect(":");
    auto* type = v.mutable_type();
    type->set_dtype(Identifier());
    Expect("[");
    if (!Peek("]")) {
      do type->add_shape(Integer());
      while (Accept(","));
    }
    Expect("]");
    return v;
  }

  std::string Ref() {
    Expect("%");
    return Identifier();
  }

  std::string OpName() {  // identifiers joined by dots: aten.max.dim
    std::string name = Identifier();
    while (p_ < t_.size() && t_[p_] == '.') {
      ++p_;
      name += "." + Identifier();
    }
    return name;
  }

  std::string Identifier() {
    Skip();
    const std::size_t start = p_;
    while (p_ < t_.size() &&
           (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_'))
      ++p_;
    if (p_ == start) Fail("a name");
    return t_.substr(start, p_ - start);
  }

  // The next number token as converted by `convert` (a std::stoll or
  // std::stod), which must use all of it; else a parse error at the token.
  template <typename T, typename Convert>
  T NumberAs(const char* expected, Convert convert) {
    const std::string n = Number();
    try {
      std::size_t used = 0;
      const T v = convert(n, &used);
      if (used == n.size()) return v;
    } catch (const std::exception&) {
    }
    p_ -= n.size();
    Fail(expected);
  }
  std::int64_t Integer() {
    return NumberAs<std::int64_t>(
        "an integer", [](const std::string& n, std::size_t* used) { return std::stoll(n, used); });
  }
  double Real() {
    return NumberAs<double>(
        "a number", [](const std::string& n, std::size_t* used) { return std::stod(n, used); });
  }
  // Whether the next number is written as a float ('.', exponent, nan, inf).
  bool NextIsReal() {
    const std::size_t start = p_;
    const bool real = Number().find_first_of(".eEn") != std::string::npos;
    p_ = start;
    return real;
  }

  std::string Number() {
    Skip();
    const std::size_t start = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) ||
                              std::strchr("+-.", t_[p_]) != nullptr)) {
      ++p_;
    }
    if (p_ == start) Fail("a number");
    return t_.substr(start, p_ - start);
  }

  void Skip() {
    while (p_ < t_.size()) {
      if (std::isspace(static_cast<unsigned char>(t_[p_]))) {
        ++p_;
      } else if (t_[p_] == '#') {  // comment to the end of the line
        while (p_ < t_.size() && t_[p_] != '\n') ++p_;
      } else {
        break;
      }
    }
  }
  bool Peek(const char* token) {
    Skip();
    return t_.compare(p_, std::strlen(token), token) == 0;
  }
  bool Accept(const char* token) {
    if (!Peek(token)) return false;
    p_ += std::strlen(token);
    return true;
  }
  void Expect(const char* token) {
    if (!Accept(token)) Fail(StrCat("'", token, "'"));
  }
  bool AcceptWord(const char* word) {
    Skip();
    const std::size_t n = std::strlen(word);
    if (t_.compare(p_, n, word) != 0) return false;
    if (p_ + n < t_.size() &&
        (std::isalnum(static_cast<unsigned char>(t_[p_ + n])) || t_[p_ + n] == '_')) {
      return false;
    }
    p_ += n;
    return true;
  }
  void Word(const char* word) {
    if (!AcceptWord(word)) Fail(StrCat("'", word, "'"));
  }
  [[noreturn]] void Fail(const std::string& expected) {
    int line = 1, column = 1;
    for (std::size_t i = 0; i < p_ && i < t_.size(); ++i) {
      if (t_[i] == '\n')
        ++line, column = 1;
      else
        ++column;
    }
    const std::string found = p_ < t_.size() ? t_.substr(p_, 12) : "the end";
    throw InvalidUsage(StrCat("graph ", origin_, ": line ", line, ", column ", column,
                              ": expected ", expected, ", found '", found, "'"));
  }

  const std::string& t_;
  const std::string& origin_;
  std::size_t p_ = 0;
};

}  // namespace

std::string PrintGraph(const proto::Graph& g) {
  std::ostringstream out;
  out << "graph " << g.name() << "(";
  for (int i = 0; i < g.inputs_size(); ++i) out << (i ? ", " : "") << Value(g.inputs(i));
  out << ") {\n";
  for (const auto& c : g.constants()) {
    out << "  const " << Value(c.value()) << " = " << ConstantData(c) << "\n";
  }
  for (const auto& n : g.nodes()) {
    out << "  ";
    for (int i = 0; i < n.outputs_size(); ++i)
      out << (i ? ", " : "") << Value(n.outputs(i));
    out << " = " << n.op() << "(";
    for (int i = 0; i < n.inputs_size(); ++i)
      out << (i ? ", " : "") << "%" << n.inputs(i);
    out << ")";
    if (!n.attrs().empty()) {
      std::map<std::string, proto::Attribute> sorted(n.attrs().begin(), n.attrs().end());
      out << " {";
      bool first = true;
      for (const auto& [k, v] : sorted) {
        out << (first ? "" : ", ") << k << " = " << Attr(v);
        first = false;
      }
      out << "}";
    }
    if (!n.source().empty()) out << "  # " << n.source();
    out << "\n";
  }
  out << "  return";
  for (int i = 0; i < g.outputs_size(); ++i) out << (i ? ", %" : " %") << g.outputs(i);
  out << "\n}\n";
  return out.str();
}

proto::Graph ParseGraph(const std::string& text, const std::string& origin) {
  return Reader(text, origin).Graph();
}

}  // namespace neuron::compiler
