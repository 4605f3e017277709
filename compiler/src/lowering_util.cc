#include "lowering_util.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::compiler {

std::int64_t Elements(const proto::TensorType& t) {
  std::int64_t n = 1;
  for (auto d : t.shape()) n *= d;
  return n;
}

std::vector<std::int64_t> Shape(const proto::TensorType& t) {
  return {t.shape().begin(), t.shape().end()};
}

std::vector<std::int64_t> ContiguousStrides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t stride = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    strides[static_cast<std::size_t>(d)] = stride;
    stride *= shape[static_cast<std::size_t>(d)];
  }
  return strides;
}

std::int64_t Dim(std::int64_t d, std::size_t rank, const std::string& where) {
  const auto r = static_cast<std::int64_t>(rank);
  NEURON_CHECK(d >= -r && d < std::max<std::int64_t>(r, 1), where, ": dim ", d,
               " is outside a ", rank, "-D tensor");
  return d < 0 ? d + r : d;
}

std::string Join(const std::vector<std::int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

proto::Value TempValue(const std::string& name, const std::string& dtype,
                       const std::vector<std::int64_t>& shape) {
  proto::Value v;
  v.set_name(name);
  v.mutable_type()->set_dtype(dtype);
  for (auto d : shape) v.mutable_type()->add_shape(d);
  return v;
}

const proto::Attribute* Attr(const proto::Node& n, const char* key) {
  auto it = n.attrs().find(key);
  return it == n.attrs().end() ? nullptr : &it->second;
}

double Number(const proto::Attribute& a) {
  return a.value_case() == proto::Attribute::kF ? a.f() : static_cast<double>(a.i());
}

double AttrNumber(const proto::Node& n, const char* key, double fallback) {
  const proto::Attribute* a = Attr(n, key);
  return a == nullptr ? fallback : Number(*a);
}

std::int64_t AttrInt(const proto::Node& n, const char* key, std::int64_t fallback) {
  const proto::Attribute* a = Attr(n, key);
  return a == nullptr ? fallback : a->i();
}

std::vector<std::int64_t> AttrInts(const proto::Node& n, const char* key) {
  const proto::Attribute* a = Attr(n, key);
  if (a == nullptr) return {};
  if (a->value_case() == proto::Attribute::kI) return {a->i()};
  return {a->ints().values().begin(), a->ints().values().end()};
}

}  // namespace neuron::compiler
