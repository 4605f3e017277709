#include "pipeline_trace_recording.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>

#include "neuron/runtime/error.h"

namespace neuron::parallel::trace_parts {

namespace {

using runtime::Mesh;
using runtime::proto::RankTrace;
using runtime::proto::TraceOp;
using runtime::proto::TracePipeline;

// Checks the figures of a rank's plan that size what is built from it (a
// trace is a file, and a file may have been damaged or made by hand).
void CheckPlan(const RankTrace& trace, const Mesh& mesh) {
  NEURON_CHECK(trace.has_pipeline(), "rank ", trace.rank(),
               "'s trace has no pipeline plan: record chunks made by "
               "torchneuron.parallel.pipeline.partition, not wrapped, under its "
               "PipelineEngine");
  const TracePipeline& plan = trace.pipeline();
  try {
    ParseScheduleKind(plan.schedule());
  } catch (const InvalidUsage& e) {
    throw InvalidUsage(StrCat("rank ", trace.rank(), "'s pipeline plan: ", e.what()));
  }
  const std::int64_t tasks = std::int64_t{2} * plan.microbatches() * plan.chunks();
  bool sound = true;
  for (double c : plan.layer_costs()) sound = sound && std::isfinite(c) && c >= 0;
  for (const auto& layer : plan.layers()) {
    sound = sound && std::isfinite(layer.gradient_bytes()) &&
            layer.gradient_bytes() >= 0 && layer.chunk() >= 0 &&
            layer.chunk() < plan.chunks() && layer.index() >= 0 &&
            layer.index() < plan.layer_costs_size();
  }
  NEURON_CHECK(
      plan.microbatches() >= 1 && plan.chunks() >= 1 && tasks <= trace.ops_size() &&
          plan.layer_costs_size() <= kMaxLayers &&
          std::int64_t{plan.chunks()} * mesh.pp <= plan.layer_costs_size() && sound,
      "rank ", trace.rank(), "'s pipeline plan is not one its trace can have run (",
      plan.microbatches(), " microbatches, ", plan.chunks(), " chunks per stage, ",
      plan.layer_costs_size(), " layers, at most ", kMaxLayers,
      "; costs and gradient bytes finite and >= 0, layers and chunks in range)");
}

bool SamePlan(const TracePipeline& a, const TracePipeline& b) {
  return a.schedule() == b.schedule() && a.microbatches() == b.microbatches() &&
         a.chunks() == b.chunks() &&
         std::equal(a.layer_costs().begin(), a.layer_costs().end(),
                    b.layer_costs().begin(), b.layer_costs().end());
}

// The partition the stages ran, from the plans of the first tensor position
// and replica: each virtual stage's layers consecutive and not empty, the
// virtual stages in order, tiling the model.
std::vector<int> RanPartition(const std::vector<RankTrace>& traces, const Mesh& mesh) {
  const TracePipeline& plan = traces[0].pipeline();
  const int v = plan.chunks() * mesh.pp, layers = plan.layer_costs_size();
  std::vector<int> first(static_cast<std::size_t>(v), layers), end(first.size(), 0),
      count(first.size(), 0);
  for (int p = 0; p < mesh.pp; ++p) {
    for (const auto& layer :
         traces[static_cast<std::size_t>(mesh.Rank(0, p, 0))].pipeline().layers()) {
      const auto vs = static_cast<std::size_t>(layer.chunk() * mesh.pp + p);
      first[vs] = std::min(first[vs], layer.index());
      end[vs] = std::max(end[vs], layer.index() + 1);
      ++count[vs];
    }
  }
  std::vector<int> starts{0};
  for (std::size_t vs = 0; vs < first.size(); ++vs) {
    NEURON_CHECK(
        count[vs] > 0 && first[vs] == starts.back() && count[vs] == end[vs] - first[vs],
        "the recorded stages' plans do not tile the model's ", layers,
        " layers in virtual stage order (virtual stage ", vs, ")");
    starts.push_back(end[vs]);
  }
  NEURON_CHECK(starts.back() == layers, "the recorded stages' plans hold ", starts.back(),
               " of the model's ", layers, " layers");
  return starts;
}

// Rank `trace`'s layers' gradient bytes, its plan checked against the
// partition.
std::map<int, double> GradientOf(const RankTrace& trace, const Recording& job) {
  const TracePipeline& plan = trace.pipeline();
  const int p = job.mesh.Pipeline(trace.rank());
  const std::vector<int> layers = StageLayers(job.starts, job.mesh.pp, plan.chunks(), p);
  std::map<int, double> gradient;
  bool same = plan.layers_size() == static_cast<int>(layers.size());
  for (int i = 0; same && i < plan.layers_size(); ++i) {
    const int k = layers[static_cast<std::size_t>(i)];
    same =
        plan.layers(i).index() == k &&
        plan.layers(i).chunk() * job.mesh.pp + p ==
            static_cast<int>(std::upper_bound(job.starts.begin(), job.starts.end(), k) -
                             job.starts.begin() - 1);
    gradient[k] = plan.layers(i).gradient_bytes();
  }
  NEURON_CHECK(same, "rank ", trace.rank(),
               "'s pipeline plan does not hold the layers its stage ran");
  return gradient;
}

// The first op where two stages' work `a` and `b` differ, the one
// all-reduce of each stage's gradients (`ga` and `gb` bytes) aside; -1 if
// none.
int FirstDifference(const Region& a, const Region& b, double ga, double gb) {
  const std::size_t n = std::min(a.ops.size(), b.ops.size());
  for (std::size_t i = 0; i < n; ++i) {
    const TraceOp &x = a.ops[i], &y = b.ops[i];
    bool same = x.op_case() == y.op_case() && x.compute().us() == y.compute().us() &&
                x.wait().issue() == y.wait().issue() &&
                x.mark().name() == y.mark().name() &&
                x.issue().messages_lane() == y.issue().messages_lane() &&
                x.issue().waited_at_issue() == y.issue().waited_at_issue() &&
                x.issue().messages_size() == y.issue().messages_size() &&
                x.issue().collectives_size() == y.issue().collectives_size();
    for (int k = 0; same && k < x.issue().collectives_size(); ++k) {
      const auto &c = x.issue().collectives(k), &d = y.issue().collectives(k);
      const bool gradient = IsGradientAllReduce(c, ga) && IsGradientAllReduce(d, gb);
      same = c.kind() == d.kind() && c.group_size() == d.group_size() &&
             (c.bytes() == d.bytes() || gradient);
    }
    if (!same) return static_cast<int>(i);
  }
  return a.ops.size() == b.ops.size() ? -1 : static_cast<int>(n);
}

// Every stage's work outside the tasks is the first stage's (at the same
// tensor position and replica), but for its gradient all-reduce.
void CheckSameOutsideTasks(const Recording& job) {
  for (int r = 0; r < job.mesh.world(); ++r) {
    const int base = job.mesh.Rank(job.mesh.Tensor(r), 0, job.mesh.Data(r));
    if (base == r) continue;
    const Stage &a = job.stages[static_cast<std::size_t>(r)],
                &b = job.stages[static_cast<std::size_t>(base)];
    const double ga = job.StageGradient(r), gb = job.StageGradient(base);
    auto check = [&](const Region& x, const Region& y, const std::string& where) {
      const int op = FirstDifference(x, y, ga, gb);
      NEURON_CHECK(op < 0, "ranks ", r, " and ", base,
                   " differ outside the pipeline's tasks (", where, ", op ", op,
                   " of it): every new stage repeats the first stage's "
                   "work there, with only its one gradient all-reduce resized");
    };
    check(a.preamble, b.preamble, "before the first step");
    for (std::size_t i = 0; i < a.steps.size(); ++i) {
      check(a.steps[i].head, b.steps[i].head, StrCat("step ", i, " before its tasks"));
      check(a.steps[i].epilogue, b.steps[i].epilogue,
            StrCat("step ", i, " after its tasks"));
      check(a.steps[i].after, b.steps[i].after, StrCat("after step ", i));
    }
  }
}

}  // namespace

int Recording::Owner(int k) const {
  const auto vs = std::upper_bound(starts.begin(), starts.end(), k) - starts.begin() - 1;
  return static_cast<int>(vs) % mesh.pp;
}

double Recording::StageGradient(int r) const {
  double total = 0;
  for (const auto& [layer, bytes] : gradient[static_cast<std::size_t>(r)]) total += bytes;
  return total;
}

double Recording::LayerGradient(int t, int d, int k) const {
  const int r = mesh.Rank(t, Owner(k), d);
  const auto& layers = gradient[static_cast<std::size_t>(r)];
  const auto it = layers.find(k);
  NEURON_CHECK(it != layers.end(), "rank ", r, "'s plan has no layer ", k);
  return it->second;
}

bool IsGradientAllReduce(const runtime::proto::TraceCollective& c, double bytes) {
  return c.kind() == "allreduce" && bytes > 0 &&
         std::abs(c.bytes() - bytes) <= 1e-9 * bytes;
}

Recording ReadRecording(const std::vector<RankTrace>& traces) {
  Recording job;
  job.mesh = runtime::CheckJobTraces(traces);
  NEURON_CHECK(job.mesh.pp >= 2,
               "scaling the pipeline needs a recording with pipeline "
               "stages (it has pp=",
               job.mesh.pp, ")");
  for (const auto& t : traces) {
    CheckPlan(t, job.mesh);
    NEURON_CHECK(SamePlan(t.pipeline(), traces[0].pipeline()), "rank ", t.rank(),
                 "'s pipeline plan differs from rank 0's");
  }
  job.plan = traces[0].pipeline();
  job.starts = RanPartition(traces, job.mesh);
  const auto order = MakeSchedule(ParseScheduleKind(job.plan.schedule()), job.mesh.pp,
                                  job.plan.microbatches(), job.plan.chunks())
                         .order;
  std::set<std::size_t> steps;
  std::set<double> headers;
  for (const auto& t : traces) {
    job.gradient.push_back(GradientOf(t, job));
    const auto p = static_cast<std::size_t>(job.mesh.Pipeline(t.rank()));
    job.stages.push_back(CutStage(t, job.mesh, job.starts, order[p]));
    steps.insert(job.stages.back().steps.size());
    headers.insert(job.stages.back().header_bytes.begin(),
                   job.stages.back().header_bytes.end());
  }
  NEURON_CHECK(steps.size() == 1, "the recorded ranks ran different numbers of steps");
  NEURON_CHECK(headers.size() == 1,
               "the recorded stage tensors' headers differ in size (", headers.size(),
               " sizes): cannot tell a new boundary's");
  job.header_bytes = *headers.begin();
  CheckSameOutsideTasks(job);
  return job;
}

}  // namespace neuron::parallel::trace_parts
