#include "neuron/compiler/schedule.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <vector>

#include "neuron/runtime/device/plan_timing.h"

namespace neuron::compiler {

namespace rp = runtime::proto;

ScheduleResult ScheduleInstructions(rp::Executable& e, const runtime::CostModel& model) {
  ScheduleResult result;
  const runtime::PlanTiming before = runtime::TimePlan(e, model);
  result.before_us = result.after_us = before.total.count();
  const int n = e.instructions_size();
  if (n < 3) return result;
  std::unordered_map<std::uint32_t, int> index;  // id -> position
  for (int k = 0; k < n; ++k) index[e.instructions(k).id()] = k;
  std::vector<std::vector<int>> users(static_cast<std::size_t>(n));
  std::vector<int> waiting(static_cast<std::size_t>(n), 0);
  for (int k = 0; k < n; ++k) {
    for (auto d : e.instructions(k).deps()) {
      users[static_cast<std::size_t>(index.at(d))].push_back(k);
      ++waiting[static_cast<std::size_t>(k)];
    }
  }
  // Priority: the longest modelled path from the instruction to the end.
  // Each instruction's duration: its span in the timeline just made (the
  // schedule lists the instructions in their order).
  std::vector<double> rank(static_cast<std::size_t>(n), 0);
  for (int k = n - 1; k >= 0; --k) {  // users come later in a valid order
    double longest = 0;
    for (int u : users[static_cast<std::size_t>(k)]) longest = std::max(longest, rank[u]);
    const auto& span = before.schedule[static_cast<std::size_t>(k)];
    rank[static_cast<std::size_t>(k)] = (span.end - span.start).count() + longest;
  }
  auto later = [&](int a, int b) {  // the queue's order: higher rank, then earlier
    return rank[a] != rank[b] ? rank[a] < rank[b] : a > b;
  };
  std::priority_queue<int, std::vector<int>, decltype(later)> ready(later);
  for (int k = 0; k < n; ++k) {
    if (waiting[static_cast<std::size_t>(k)] == 0) ready.push(k);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int k = ready.top();
    ready.pop();
    order.push_back(k);
    for (int u : users[static_cast<std::size_t>(k)]) {
      if (--waiting[static_cast<std::size_t>(u)] == 0) ready.push(u);
    }
  }
  if (static_cast<int>(order.size()) != n) return result;  // not a DAG: keep it as it is
  rp::Executable scheduled = e;
  scheduled.clear_instructions();
  std::unordered_map<std::uint32_t, std::uint32_t> renamed;  // old id -> new id
  for (int k = 0; k < n; ++k) {
    renamed[e.instructions(order[static_cast<std::size_t>(k)]).id()] = static_cast<std::uint32_t>(k);
  }
  for (int k = 0; k < n; ++k) {
    rp::Instruction i = e.instructions(order[static_cast<std::size_t>(k)]);
    i.set_id(static_cast<std::uint32_t>(k));
    for (auto& d : *i.mutable_deps()) d = renamed.at(d);
    *scheduled.add_instructions() = std::move(i);
  }
  const double after = runtime::TimePlan(scheduled, model).total.count();
  if (after < result.before_us) {
    e = std::move(scheduled);
    result.after_us = after;
    result.reordered = true;
  }
  return result;
}

}  // namespace neuron::compiler
