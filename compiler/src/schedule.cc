#include "neuron/compiler/schedule.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <vector>

#include "neuron/runtime/device/plan_timing.h"

namespace neuron::compiler {

namespace {

namespace rp = runtime::proto;

// Each instruction's modelled duration.
std::vector<double> Durations(const rp::Executable& e, const runtime::CostModel& model) {
  std::unordered_map<std::uint32_t, const rp::Buffer*> buffers;
  for (const auto& b : e.buffers()) buffers[b.id()] = &b;
  std::vector<double> out;
  for (const auto& i : e.instructions()) {
    const bool fp32 = i.engine() == rp::TENSOR && !i.inputs().empty() &&
                      buffers.at(i.inputs(0))->dtype() == rp::F32;
    out.push_back(runtime::InstructionDuration(i, model, fp32).count());
  }
  return out;
}

}  // namespace

ScheduleResult ScheduleInstructions(rp::Executable& e, const runtime::CostModel& model) {
  ScheduleResult result;
  result.before_us = result.after_us = runtime::TimePlan(e, model).total.count();
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
  const std::vector<double> cost = Durations(e, model);
  std::vector<double> rank(static_cast<std::size_t>(n), 0);
  for (int k = n - 1; k >= 0; --k) {  // users come later in a valid order
    double longest = 0;
    for (int u : users[static_cast<std::size_t>(k)]) longest = std::max(longest, rank[u]);
    rank[static_cast<std::size_t>(k)] = cost[static_cast<std::size_t>(k)] + longest;
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
