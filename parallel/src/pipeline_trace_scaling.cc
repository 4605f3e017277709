#include "neuron/parallel/pipeline_trace_scaling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fnv.h"
#include "neuron/runtime/op_trace.h"
#include "pipeline_trace_recording.h"

namespace neuron::parallel {

namespace {

using runtime::Mesh;
using runtime::proto::RankTrace;
using runtime::proto::TraceCollective;
using runtime::proto::TraceOp;
using runtime::proto::TracePipeline;
using runtime::proto::TracePipelineMark;
using trace_parts::Region;

using trace_parts::Recording;

constexpr double kMaxSize = 1 << 26;  // ops and group members of the new traces

bool Rooted(const std::string& kind) {
  return kind == "broadcast" || kind == "reduce" || kind == "gather" || kind == "scatter";
}

// The name of a communicator of `group` that plays the part recorded
// communicator `recorded` played (its "#k" suffix: one of the communicators
// a set of ranks made): the same on every member, and one for every
// recorded stage's (so its collectives run one after another, as they did).
std::string Renamed(const std::string& recorded, const std::vector<int>& group) {
  const auto hash = runtime::Fnv1a(group.data(), group.size() * sizeof(int));
  const auto part = recorded.rfind('#');
  return StrCat("pp-scaled ", group.size(), " ranks from ", group.front(), " ", hash,
                part == std::string::npos ? "#" + recorded : recorded.substr(part));
}

// One rank of the new job, op by op.
class Writer {
 public:
  Writer(const Recording& job, const Mesh& to, int rank)
      : job_(job), to_(to), rank_(rank), stage_(to.Pipeline(rank)) {
    out_.set_rank(rank);
    out_.set_world_size(to.world());
    out_.mutable_layout()->set_tp(to.tp);
    out_.mutable_layout()->set_pp(to.pp);
    out_.mutable_layout()->set_dp(to.dp);
  }

  // Recorded ops of rank `source`, their waits and groups moved to this rank.
  void Append(const Region& region, int source) {
    const auto base = static_cast<std::uint64_t>(out_.ops_size());
    for (const TraceOp& op : region.ops) {
      TraceOp* o = out_.add_ops();
      *o = op;
      if (o->has_wait()) o->mutable_wait()->set_issue(base + op.wait().issue());
      if (!o->has_issue()) continue;
      NEURON_CHECK(o->issue().messages_size() == 0, "rank ", source,
                   ": a message outside the pipeline's tasks (to rank ",
                   o->issue().messages(0).peer(), ", tag ", o->issue().messages(0).tag(),
                   ")");
      for (auto& c : *o->mutable_issue()->mutable_collectives()) c = Moved(c, source);
    }
  }

  void Add(const TraceOp& op) { *out_.add_ops() = op; }

  void Mark(TracePipelineMark::Kind kind, const PipelineTask& task, int vs) {
    auto* mark = out_.add_ops()->mutable_mark();
    mark->set_name("pipeline");
    *mark->mutable_pipeline() =
        runtime::TaskMark(kind, task.forward, task.microbatch, vs);
  }

  // A stage tensor to or from stage `peer_stage`: its header, then its data.
  std::vector<std::uint64_t> Tensor(bool send, int peer_stage, double bytes,
                                    std::uint64_t tag, const std::string& communicator) {
    std::vector<std::uint64_t> issues;
    const int peer = to_.Rank(to_.Tensor(rank_), peer_stage, to_.Data(rank_));
    for (int part = 0; part < 2; ++part) {
      auto* issue = out_.add_ops()->mutable_issue();
      issue->set_messages_lane(true);
      auto* m = issue->add_messages();
      m->set_send(send);
      m->set_peer(peer);
      m->set_bytes(part == 0 ? job_.header_bytes : bytes);
      m->set_tag(2 * tag + static_cast<std::uint64_t>(part));
      m->set_communicator(communicator);
      issues.push_back(static_cast<std::uint64_t>(out_.ops_size() - 1));
      if (!send) out_.add_ops()->mutable_wait()->set_issue(issues.back());
    }
    return issues;
  }

  void Wait(std::uint64_t issue) { out_.add_ops()->mutable_wait()->set_issue(issue); }

  double members() const { return members_; }
  RankTrace& trace() { return out_; }

 private:
  // A recorded collective of rank `source` on this rank: a group at one
  // stage moves to this rank's, one spanning the pipeline spans the new one.
  TraceCollective Moved(const TraceCollective& c, int source) {
    const Mesh& m = job_.mesh;
    std::set<int> t, d, p;
    for (int member : c.group()) {
      t.insert(m.Tensor(member));
      d.insert(m.Data(member));
      p.insert(m.Pipeline(member));
    }
    NEURON_CHECK(
        t.size() * d.size() * p.size() == static_cast<std::size_t>(c.group_size()) &&
            (p.size() == 1 || static_cast<int>(p.size()) == m.pp),
        "rank ", source, ": the ", c.kind(), " on communicator ", c.communicator(),
        " has a group that is not a block of the mesh spanning one stage or all");
    const bool spans = p.size() > 1;
    const int root_p = m.Pipeline(c.group(c.root()));
    NEURON_CHECK(!spans || !Rooted(c.kind()) || root_p == 0 || root_p == m.pp - 1,
                 "rank ", source, ": the ", c.kind(), " on communicator ",
                 c.communicator(), " is rooted at stage ", root_p,
                 ", neither the first nor the last");
    const int new_root_p = !spans ? stage_ : (root_p == m.pp - 1 ? to_.pp - 1 : root_p);
    const int root =
        to_.Rank(m.Tensor(c.group(c.root())), new_root_p, m.Data(c.group(c.root())));
    std::vector<int> group;
    for (int s = 0; s < to_.pp; ++s) {
      if (!spans && s != stage_) continue;
      for (int dd : d) {
        for (int tt : t) group.push_back(to_.Rank(tt, s, dd));
      }
    }
    std::sort(group.begin(), group.end());
    TraceCollective out = c;
    out.clear_group();
    for (int member : group) out.add_group(member);
    out.set_root(
        static_cast<int>(std::find(group.begin(), group.end(), root) - group.begin()));
    out.set_communicator(Renamed(c.communicator(), group));
    out.set_sequence(sequences_[out.communicator()]++);
    members_ += static_cast<double>(group.size());
    return out;
  }

  const Recording& job_;
  Mesh to_;
  int rank_, stage_;
  RankTrace out_;
  std::map<std::string, std::uint64_t> sequences_;  // per communicator
  double members_ = 0;
};

// The new job's ranks, from the recorded job.
class Assembler {
 public:
  Assembler(const Recording& job, int pp)
      : job_(job),
        to_{job.mesh.tp, pp, job.mesh.dp},
        starts_(trace_parts::Partition(job.plan, pp)),
        order_(MakeSchedule(ParseScheduleKind(job.plan.schedule()), pp,
                            job.plan.microbatches(), job.plan.chunks())
                   .order) {}

  const Mesh& target() const { return to_; }

  // Rank r's trace; adds its ops and group members to `size`.
  RankTrace Rank(int r, double& size) const {
    const int t = to_.Tensor(r), d = to_.Data(r), s = to_.Pipeline(r);
    // Outside the tasks every stage repeats the first's (ReadRecording
    // checked that the recorded stages do).
    const int source = job_.mesh.Rank(t, 0, d);
    const trace_parts::Stage& first = job_.stages[static_cast<std::size_t>(source)];
    const std::string pipe = Communicator(t, d);
    const double gradient = Gradient(t, d, s);
    Writer w(job_, to_, r);
    w.Append(first.preamble, source);
    for (std::size_t i = 0; i < first.steps.size(); ++i) {
      const trace_parts::Step& step = first.steps[i];
      w.Add(step.begin);
      w.Append(step.head, source);
      std::vector<std::uint64_t> sends;
      for (const PipelineTask& task : order_[static_cast<std::size_t>(s)]) {
        Task(w, i, task, r, pipe, sends);
      }
      for (std::uint64_t issue : sends) w.Wait(issue);
      w.Append(Epilogue(step.epilogue, source, gradient), source);
      w.Add(step.end);
      w.Append(step.after, source);
    }
    *w.trace().mutable_pipeline() = Plan(t, d, s);
    size += w.members() + w.trace().ops_size();
    return std::move(w.trace());
  }

 private:
  int virtual_stages() const { return to_.pp * job_.plan.chunks(); }

  // Layer k's recorded work in step i, from the rank at (t, d) that ran it.
  const trace_parts::LayerWork& Layer(std::size_t i, int k, int microbatch, bool forward,
                                      int t, int d, int* source) const {
    *source = job_.mesh.Rank(t, job_.Owner(k), d);
    const auto& layers = job_.stages[static_cast<std::size_t>(*source)].steps[i].layers;
    const auto it = layers.find({k, microbatch, forward});
    NEURON_ASSERT(it != layers.end(), "a layer's work the cut checked is missing");
    return it->second;
  }

  // The bytes of the activation into layer k (and of its gradient).
  double Input(std::size_t i, int k, int microbatch, int t, int d) const {
    int source = 0;
    return Layer(i, k, microbatch, true, t, d, &source).mark.pipeline().input_bytes();
  }

  // Task `task` of rank r in step i; its stage tensors over communicator
  // `pipe`, its sends' issues added to `sends`.
  void Task(Writer& w, std::size_t i, const PipelineTask& task, int r,
            const std::string& pipe, std::vector<std::uint64_t>& sends) const {
    const int t = to_.Tensor(r), d = to_.Data(r), s = to_.Pipeline(r);
    const int vs = task.chunk * to_.pp + s, mb = task.microbatch, v = virtual_stages();
    const auto first = static_cast<std::size_t>(vs);
    // The tag of an activation or gradient between virtual stages
    // `boundary` - 1 and `boundary` (Writer::Tensor tags its two messages).
    auto tag = [&](bool gradient, int boundary) {
      return (static_cast<std::uint64_t>(mb) * v + boundary) * 2 + (gradient ? 1 : 0);
    };
    w.Mark(TracePipelineMark::TASK_BEGIN, task, vs);
    if (task.forward && vs > 0) {
      w.Tensor(false, (vs - 1) % to_.pp, Input(i, starts_[first], mb, t, d),
               tag(false, vs), pipe);
    }
    if (!task.forward && vs < v - 1) {
      w.Tensor(false, (vs + 1) % to_.pp, Input(i, starts_[first + 1], mb, t, d),
               tag(true, vs + 1), pipe);
    }
    const int a = starts_[first], b = starts_[first + 1];
    for (int n = 0; n < b - a; ++n) {
      int source = 0;
      const auto& layer =
          Layer(i, task.forward ? a + n : b - 1 - n, mb, task.forward, t, d, &source);
      w.Append(layer.before, source);
      TraceOp mark;
      *mark.mutable_mark() = layer.mark;
      w.Add(mark);
      w.Append(layer.work, source);
    }
    w.Mark(TracePipelineMark::TASK_END, task, vs);
    std::vector<std::uint64_t> issued;
    if (task.forward && vs < v - 1) {
      issued = w.Tensor(true, (vs + 1) % to_.pp, Input(i, starts_[first + 1], mb, t, d),
                        tag(false, vs + 1), pipe);
    }
    if (!task.forward && vs > 0) {
      issued = w.Tensor(true, (vs - 1) % to_.pp, Input(i, starts_[first], mb, t, d),
                        tag(true, vs), pipe);
    }
    sends.insert(sends.end(), issued.begin(), issued.end());
  }

  // The pipeline group's communicator at (t, d), named from the recorded one.
  std::string Communicator(int t, int d) const {
    const auto& first = job_.stages[static_cast<std::size_t>(job_.mesh.Rank(t, 0, d))];
    NEURON_ASSERT(!first.communicator.empty(),
                  "the cut found no stage tensor on the first stage");
    return StrCat(first.communicator, "@", to_.Rank(t, 0, d));
  }

  // The gradient bytes of the new stage s's layers (at t, d).
  double Gradient(int t, int d, int s) const {
    double total = 0;
    for (int k : trace_parts::StageLayers(starts_, to_.pp, job_.plan.chunks(), s)) {
      total += job_.LayerGradient(t, d, k);
    }
    return total;
  }

  // The recorded stage's epilogue with its gradient all-reduce resized to
  // `bytes`: the one all-reduce of the recorded stage's gradient bytes.
  Region Epilogue(const Region& recorded, int source, double bytes) const {
    Region out = recorded;
    const double recorded_bytes = job_.StageGradient(source);
    int found = 0;
    for (TraceOp& op : out.ops) {
      if (!op.has_issue()) continue;
      for (TraceCollective& c : *op.mutable_issue()->mutable_collectives()) {
        if (trace_parts::IsGradientAllReduce(c, recorded_bytes)) {
          c.set_bytes(bytes);
          ++found;
        }
      }
    }
    NEURON_CHECK(found == 1 || (found == 0 && job_.mesh.dp == 1), "rank ", source,
                 ": its stage's gradients (", recorded_bytes,
                 " bytes) are not one "
                 "all-reduce at the end of its step (",
                 found,
                 " are): byte-capped buckets "
                 "cannot be resized to another stage's layers");
    return out;
  }

  // The new stage's plan: the recorded schedule and costs, its layers.
  TracePipeline Plan(int t, int d, int s) const {
    TracePipeline plan = job_.plan;
    plan.clear_layers();
    for (int k : trace_parts::StageLayers(starts_, to_.pp, plan.chunks(), s)) {
      auto* layer = plan.add_layers();
      layer->set_index(k);
      layer->set_chunk(static_cast<int>(
          (std::upper_bound(starts_.begin(), starts_.end(), k) - starts_.begin() - 1) /
          to_.pp));
      layer->set_gradient_bytes(job_.LayerGradient(t, d, k));
    }
    return plan;
  }

  const Recording& job_;
  Mesh to_;
  std::vector<int> starts_;
  std::vector<std::vector<PipelineTask>> order_;
};

// An estimate of the new traces' ops, before they are made: each new
// rank's work outside the tasks and its tasks' marks and messages, and the
// layers' work once per tensor position and replica (as recorded).
double EstimatedOps(const Recording& job, int pp) {
  const trace_parts::Stage& first = job.stages.front();
  double outside = static_cast<double>(first.preamble.ops.size()), recorded = 0;
  for (const auto& step : first.steps) {
    outside += static_cast<double>(step.head.ops.size() + step.epilogue.ops.size() +
                                   step.after.ops.size());
  }
  for (const auto& stage : job.stages) {
    for (const auto& step : stage.steps) {
      for (const auto& [key, layer] : step.layers) {
        recorded +=
            static_cast<double>(layer.before.ops.size() + layer.work.ops.size() + 1);
      }
    }
  }
  const double tasks = 2.0 * job.plan.microbatches() * job.plan.chunks() *
                       static_cast<double>(first.steps.size());
  const double world = static_cast<double>(pp) * job.mesh.tp * job.mesh.dp;
  return world * (outside + 8 * tasks) + recorded;
}

}  // namespace

std::vector<RankTrace> ScalePipeline(const std::vector<RankTrace>& traces, int pp) {
  const Mesh recorded = runtime::CheckJobTraces(traces);
  NEURON_CHECK(traces.front().layout().ep() <= 1, "cannot scale the pipeline of an "
               "expert-parallel recording (ep ", traces.front().layout().ep(), ")");
  const TracePipeline& plan = traces.front().pipeline();
  NEURON_CHECK(pp >= recorded.pp, "cannot scale to pp=", pp,
               ", below the recording's pp=", recorded.pp,
               ": a stage would hold more gradient bytes, which a byte-capped "
               "bucketing may split into more collectives than the recording issued");
  NEURON_CHECK(std::int64_t{pp} * recorded.tp * recorded.dp <= (1 << 20),
               "cannot scale to pp=", pp, ": the job would have more than 2^20 ranks");
  NEURON_CHECK(std::int64_t{pp} * plan.chunks() <= plan.layer_costs_size(),
               "cannot scale to pp=", pp, ": ", pp, " stages of ", plan.chunks(),
               " chunks need more than the model's ", plan.layer_costs_size(), " layers");
  const Recording job = trace_parts::ReadRecording(traces);
  const double estimate = EstimatedOps(job, pp);
  NEURON_CHECK(estimate <= kMaxSize, "cannot scale to pp=", pp,
               ": the traces would hold about ", estimate, " ops (more than 2^26)");
  const Assembler assembler(job, pp);
  std::vector<RankTrace> out;
  double size = 0;
  for (int r = 0; r < assembler.target().world(); ++r) {
    out.push_back(assembler.Rank(r, size));
    NEURON_CHECK(size <= kMaxSize, "cannot scale to pp=", pp,
                 ": the traces would hold more than 2^26 ops and group members");
  }
  return out;
}

}  // namespace neuron::parallel
