#include "neuron/parallel/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

constexpr double kForward = 1, kBackward = 2;

// Megatron-LM's order of a stage's forwards: microbatches in groups of p,
// chunk-major within a group (chunks reversed for the backwards). A last,
// smaller group keeps the same shape.
std::vector<PipelineTask> Ordered(int p, int m, int v, bool forward) {
  std::vector<PipelineTask> tasks;
  for (int group = 0; group * p < m; ++group) {
    for (int c = 0; c < v; ++c) {
      for (int mb = group * p; mb < std::min(m, (group + 1) * p); ++mb) {
        tasks.push_back({forward, mb, forward ? c : v - 1 - c});
      }
    }
  }
  return tasks;
}

// A stage's execution order: `warmup` forwards, then one forward and one
// backward at a time, then the remaining backwards.
std::vector<PipelineTask> Interleave(const std::vector<PipelineTask>& forwards,
                                     const std::vector<PipelineTask>& backwards, int warmup) {
  std::vector<PipelineTask> order;
  const int total = static_cast<int>(forwards.size());
  warmup = std::min(warmup, total);
  std::size_t f = 0, b = 0;
  while (static_cast<int>(f) < warmup) order.push_back(forwards[f++]);
  while (f < forwards.size()) {
    order.push_back(forwards[f++]);
    order.push_back(backwards[b++]);
  }
  while (b < backwards.size()) order.push_back(backwards[b++]);
  return order;
}

// Runs the orders (each stage strictly in its order, a task once its
// inputs exist): returns the makespan and each stage's peak of forwards not
// yet backwarded. InvalidUsage if the orders deadlock (a bug: every order
// made here is checked by this at creation).
void Simulate(int p, int v, PipelinePlan& plan) {
  const int m = static_cast<int>(plan.order[0].size()) / (2 * v);
  std::vector<std::vector<double>> forward_done(m, std::vector<double>(p * v, -1));
  auto backward_done = forward_done;
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int> in_flight(p, 0);
  plan.max_in_flight.assign(p, 0);
  std::size_t left = 0;
  for (const auto& o : plan.order) left += o.size();
  while (left > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == plan.order[s].size()) continue;
      const PipelineTask& t = plan.order[s][next[s]];
      const int vs = t.chunk * p + s;
      double ready = free_at[s];
      if (t.forward) {
        if (vs > 0) {
          if (forward_done[t.microbatch][vs - 1] < 0) continue;
          ready = std::max(ready, forward_done[t.microbatch][vs - 1]);
        }
      } else {
        ready = std::max(ready, forward_done[t.microbatch][vs]);
        if (vs < p * v - 1) {
          if (backward_done[t.microbatch][vs + 1] < 0) continue;
          ready = std::max(ready, backward_done[t.microbatch][vs + 1]);
        }
      }
      const double end = ready + (t.forward ? kForward : kBackward);
      (t.forward ? forward_done : backward_done)[t.microbatch][vs] = end;
      free_at[s] = end;
      in_flight[s] += t.forward ? 1 : -1;
      plan.max_in_flight[s] = std::max(plan.max_in_flight[s], in_flight[s]);
      plan.makespan = std::max(plan.makespan, end);
      ++next[s];
      --left;
      progressed = true;
    }
    NEURON_CHECK(progressed, "pipeline schedule: the stages' orders deadlock (p=", p,
                 ", v=", v, ", m=", m, ")");
  }
}

}  // namespace

ScheduleKind ParseScheduleKind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneForwardOneBackward;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  throw InvalidUsage("pipeline schedule must be gpipe, 1f1b or interleaved, got '" + name + "'");
}

PipelinePlan MakeSchedule(ScheduleKind kind, int stages, int microbatches, int chunks) {
  NEURON_CHECK(stages >= 1, "pipeline schedule: stages must be >= 1, got ", stages);
  NEURON_CHECK(microbatches >= 1, "pipeline schedule: microbatches must be >= 1, got ",
               microbatches);
  NEURON_CHECK(chunks >= 1, "pipeline schedule: model chunks per stage must be >= 1, got ",
               chunks);
  NEURON_CHECK(chunks == 1 || kind == ScheduleKind::kInterleaved,
               "pipeline schedule: ", chunks, " model chunks per stage need the interleaved "
               "schedule");
  const int p = stages, m = microbatches, v = chunks;
  PipelinePlan plan;
  for (int s = 0; s < p; ++s) {
    const auto forwards = Ordered(p, m, v, true), backwards = Ordered(p, m, v, false);
    int warmup = m * v;  // GPipe: every forward first
    if (kind == ScheduleKind::kOneForwardOneBackward) warmup = p - s - 1;
    if (kind == ScheduleKind::kInterleaved) warmup = 2 * (p - s - 1) + (v - 1) * p;
    plan.order.push_back(Interleave(forwards, backwards, warmup));
  }
  Simulate(p, v, plan);
  plan.ideal = m * v * (kForward + kBackward);
  return plan;
}

std::vector<int> BalancedPartition(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  NEURON_CHECK(parts >= 1 && parts <= n, "pipeline partition: cannot split ", n,
               " layers into ", parts, " stages");
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest possible maximum over splitting the first i layers into k parts.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (cost < best[k][i]) {
          best[k][i] = cost;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> starts(parts + 1);
  starts[parts] = n;
  for (int k = parts, i = n; k >= 1; --k) {
    i = cut[k][i];
    starts[k - 1] = i;
  }
  return starts;
}

}  // namespace neuron::parallel
