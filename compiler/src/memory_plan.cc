#include "neuron/compiler/memory_plan.h"

#include <algorithm>

#include "neuron/runtime/error.h"

namespace neuron::compiler {
namespace {

std::uint64_t Align(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

bool Overlap(const Interval& a, const Interval& b) {
  return a.first <= b.last && b.first <= a.last;
}

}  // namespace

MemoryPlan PlanMemory(const std::vector<Interval>& values, std::uint64_t capacity,
                      std::uint64_t alignment, const std::string& memory_name) {
  NEURON_CHECK(alignment > 0, "memory plan: alignment must be > 0");
  MemoryPlan plan;
  int horizon = 0;
  for (const auto& v : values) {
    NEURON_CHECK(v.last >= v.first, "memory plan: ", v.name, " is read (", v.last,
                 ") before it is defined (", v.first, ")");
    plan.no_reuse_bytes += Align(v.bytes, alignment);
    horizon = std::max(horizon, v.last + 1);
  }
  std::vector<std::uint64_t> alive(horizon, 0);
  for (const auto& v : values) {
    for (int t = v.first; t <= v.last; ++t) alive[t] += Align(v.bytes, alignment);
  }
  for (auto a : alive) plan.lower_bound_bytes = std::max(plan.lower_bound_bytes, a);

  std::vector<const Interval*> order;
  for (const auto& v : values) order.push_back(&v);
  std::stable_sort(order.begin(), order.end(), [](const Interval* a, const Interval* b) {
    return a->bytes != b->bytes ? a->bytes > b->bytes : a->first < b->first;
  });
  struct Placed {
    const Interval* value;
    std::uint64_t offset, end;
  };
  std::vector<Placed> placed;
  for (const Interval* v : order) {
    const std::uint64_t size = Align(v->bytes, alignment);
    // Conflicting blocks, by offset: take the first gap that fits.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
    for (const auto& p : placed) {
      if (Overlap(*p.value, *v)) taken.emplace_back(p.offset, p.end);
    }
    std::sort(taken.begin(), taken.end());
    std::uint64_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    NEURON_CHECK(offset + size <= capacity, "memory plan: ", v->name, " (", v->bytes,
                 " bytes) does not fit in ", memory_name, ": ", capacity,
                 " bytes, already ", offset, " in use while it is alive");
    placed.push_back({v, offset, offset + size});
    plan.offsets[v->name] = offset;
    plan.planned_bytes = std::max(plan.planned_bytes, offset + size);
  }
  return plan;
}

}  // namespace neuron::compiler
