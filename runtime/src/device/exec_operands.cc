// The executor's shared float operands (exec_operands.h).
#include "exec_operands.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::runtime::detail {

bool Overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* x = static_cast<const std::uint8_t*>(a);
  const auto* y = static_cast<const std::uint8_t*>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

std::vector<float> FloatOperand(const Placed& p, std::size_t n, const What& what,
                                bool mask) {
  const proto::ElementType type = p.buffer->dtype();
  NEURON_CHECK(mask ? type == proto::BOOL || type == proto::U8 : kernels::IsFloat(type),
               what, ": buffer ", p.buffer->name(), " is ", proto::ElementType_Name(type),
               mask ? ", not a BOOL or U8 mask" : ", not float");
  const std::size_t m = std::min(p.elements(), n);
  NEURON_CHECK(m > 0 && n % m == 0, what, ": buffer ", p.buffer->name(), " of ",
               p.elements(), " elements does not repeat over ", n);
  if (!mask) return kernels::ToFloat(p.data, type, m);
  std::vector<float> set(m);
  for (std::size_t e = 0; e < m; ++e) set[e] = p.data[e] != 0 ? 1.0f : 0.0f;
  return set;
}

FloatIn FloatOperandIn(const Placed& p, std::size_t n, const What& what,
                       bool mask) {
  FloatIn r;
  if (!mask && p.buffer->dtype() == proto::F32) {
    const std::size_t m = std::min(p.elements(), n);
    NEURON_CHECK(m > 0 && n % m == 0, what, ": buffer ", p.buffer->name(), " of ",
                 p.elements(), " elements does not repeat over ", n);
    r.data = reinterpret_cast<const float*>(p.data);
    r.size = m;
    return r;
  }
  r.copy = FloatOperand(p, n, what, mask);
  r.data = r.copy.data();
  r.size = r.copy.size();
  return r;
}

}  // namespace neuron::runtime::detail
