#include "neuron/compiler/schedule.h"

#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>
#include <vector>

#include "neuron/runtime/device/plan_timing.h"

namespace neuron::compiler {

namespace rp = runtime::proto;

namespace {

// The plan as a DAG: positions, each instruction's users and dependency
// count, its engine, its modelled duration and its priority (the longest
// modelled path from it to the end).
struct Dag {
  std::vector<std::vector<int>> users;
  std::vector<int> deps;
  std::vector<int> engine;
  std::vector<double> duration, rank;
  std::vector<double> held;  // how long it holds its engine (a DMA: not its latency)
};

Dag MakeDag(const rp::Executable& e, const runtime::PlanTiming& timing,
            const runtime::CostModel& model) {
  const int n = e.instructions_size();
  Dag g;
  g.users.resize(static_cast<std::size_t>(n));
  g.deps.assign(static_cast<std::size_t>(n), 0);
  g.engine.resize(static_cast<std::size_t>(n));
  g.duration.resize(static_cast<std::size_t>(n));
  g.held.resize(static_cast<std::size_t>(n));
  g.rank.assign(static_cast<std::size_t>(n), 0);
  std::unordered_map<std::uint32_t, int> index;  // id -> position
  for (int k = 0; k < n; ++k) index[e.instructions(k).id()] = k;
  for (int k = 0; k < n; ++k) {
    const auto uk = static_cast<std::size_t>(k);
    for (auto d : e.instructions(k).deps()) {
      g.users[static_cast<std::size_t>(index.at(d))].push_back(k);
      ++g.deps[uk];
    }
    g.engine[uk] = static_cast<int>(timing.schedule[uk].engine);
    // Durations do not depend on the order (the timeline lists the
    // instructions in theirs).
    g.duration[uk] = (timing.schedule[uk].end - timing.schedule[uk].start).count();
    g.held[uk] = runtime::EngineHeld(timing.schedule[uk].engine,
                                     runtime::SimDuration(g.duration[uk]), model)
                     .count();
  }
  for (int k = n - 1; k >= 0; --k) {  // users come later in a valid order
    double longest = 0;
    for (int u : g.users[static_cast<std::size_t>(k)])
      longest = std::max(longest, g.rank[u]);
    g.rank[static_cast<std::size_t>(k)] =
        g.duration[static_cast<std::size_t>(k)] + longest;
  }
  return g;
}

// Always the ready instruction with the highest rank (then the earliest).
std::vector<int> ByRank(const Dag& g) {
  auto later = [&](int a, int b) {
    return g.rank[a] != g.rank[b] ? g.rank[a] < g.rank[b] : a > b;
  };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  std::vector<int> waiting = g.deps;
  for (std::size_t k = 0; k < waiting.size(); ++k) {
    if (waiting[k] == 0) ready.push(static_cast<int>(k));
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int k = ready.top();
    ready.pop();
    order.push_back(k);
    for (int u : g.users[static_cast<std::size_t>(k)]) {
      if (--waiting[static_cast<std::size_t>(u)] == 0) ready.push(u);
    }
  }
  return order;
}

// Simulates the engines: always the ready instruction that can start
// first (the free engine's highest-ranked one on a tie). A DMA that only
// the end needs (a returned value) so goes out while compute still runs,
// where ByRank lists it last. O(n x ready).
std::vector<int> ByStartTime(const Dag& g) {
  const std::size_t n = g.deps.size();
  std::vector<int> waiting = g.deps, ready;
  std::vector<double> earliest(n, 0);  // the end of its dependencies
  std::array<double, runtime::kEngineCount> free{};
  for (std::size_t k = 0; k < n; ++k) {
    if (waiting[k] == 0) ready.push_back(static_cast<int>(k));
  }
  std::vector<int> order;
  while (!ready.empty()) {
    std::size_t best = 0;
    double best_start = 0;
    for (std::size_t r = 0; r < ready.size(); ++r) {
      const auto k = static_cast<std::size_t>(ready[r]);
      const double start =
          std::max(earliest[k], free[static_cast<std::size_t>(g.engine[k])]);
      const auto b = static_cast<std::size_t>(ready[best]);
      if (r == 0 || start < best_start ||
          (start == best_start &&
           (g.rank[k] > g.rank[b] || (g.rank[k] == g.rank[b] && k < b)))) {
        best = r;
        best_start = start;
      }
    }
    const int k = ready[best];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    order.push_back(k);
    const double end = best_start + g.duration[static_cast<std::size_t>(k)];
    free[static_cast<std::size_t>(g.engine[static_cast<std::size_t>(k)])] =
        best_start + g.held[static_cast<std::size_t>(k)];
    for (int u : g.users[static_cast<std::size_t>(k)]) {
      const auto uu = static_cast<std::size_t>(u);
      earliest[uu] = std::max(earliest[uu], end);
      if (--waiting[uu] == 0) ready.push_back(u);
    }
  }
  return order;
}

using Instructions = google::protobuf::RepeatedPtrField<rp::Instruction>;

// `e`'s instructions in `order`, renumbered 0.. with their dependencies
// (the instructions only: the rest of the executable, constants included,
// is not copied).
Instructions Reordered(const rp::Executable& e, const std::vector<int>& order) {
  const int n = e.instructions_size();
  std::unordered_map<std::uint32_t, std::uint32_t> renamed;  // old id -> new id
  for (int k = 0; k < n; ++k) {
    renamed[e.instructions(order[static_cast<std::size_t>(k)]).id()] =
        static_cast<std::uint32_t>(k);
  }
  Instructions out;
  out.Reserve(n);
  for (int k = 0; k < n; ++k) {
    rp::Instruction* i = out.Add();
    *i = e.instructions(order[static_cast<std::size_t>(k)]);
    i->set_id(static_cast<std::uint32_t>(k));
    for (auto& d : *i->mutable_deps()) d = renamed.at(d);
  }
  return out;
}

}  // namespace

ScheduleResult ScheduleInstructions(rp::Executable& e, const runtime::CostModel& model) {
  ScheduleResult result;
  const runtime::PlanTiming before = runtime::TimePlan(e, model);
  result.before_us = result.after_us = before.total.count();
  const int n = e.instructions_size();
  if (n < 3) return result;
  const Dag g = MakeDag(e, before, model);
  Instructions best;
  for (const auto& order : {ByRank(g), ByStartTime(g)}) {
    if (static_cast<int>(order.size()) != n) return result;  // not a DAG: keep it
    Instructions scheduled = Reordered(e, order);
    e.mutable_instructions()->Swap(&scheduled);  // timed in place, then put back
    const double after = runtime::TimePlan(e, model).total.count();
    e.mutable_instructions()->Swap(&scheduled);
    if (after < result.after_us) {
      best.Swap(&scheduled);
      result.after_us = after;
      result.reordered = true;
    }
  }
  if (result.reordered) e.mutable_instructions()->Swap(&best);
  return result;
}

}  // namespace neuron::compiler
