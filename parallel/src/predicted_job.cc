#include "neuron/parallel/predicted_job.h"

#include <cmath>

#include "neuron/parallel/pipeline_schedule.h"
#include "neuron/runtime/error.h"

namespace neuron::parallel {

namespace {

namespace rp = runtime::proto;

struct Coordinates {
  int t, d, p;
};

// One rank's trace as it is written, op by op.
class TraceWriter {
 public:
  TraceWriter(rp::RankTrace* trace) : trace_(trace) {}

  void Compute(double us) {
    if (us <= 0) return;
    if (trace_->ops_size() > 0 && trace_->ops(trace_->ops_size() - 1).has_compute()) {
      auto* last = trace_->mutable_ops(trace_->ops_size() - 1)->mutable_compute();
      last->set_us(last->us() + us);  // consecutive charges are one
      return;
    }
    trace_->add_ops()->mutable_compute()->set_us(us);
  }

  void Mark(const char* name) { trace_->add_ops()->mutable_mark()->set_name(name); }

  // A message to or from `peer`; a receive blocks the compute stream.
  void Message(bool send, int peer, double bytes) {
    auto* issue = trace_->add_ops()->mutable_issue();
    issue->set_messages_lane(true);
    issue->set_waited_at_issue(!send);
    auto* m = issue->add_messages();
    m->set_send(send);
    m->set_peer(peer);
    m->set_bytes(bytes);
    m->set_communicator("pp");
  }

  // A collective on the data-parallel stream (a group of all dp ranks or of
  // the experts' replicas); returns its op index.
  std::uint64_t Collective(const char* kind, const std::vector<int>& group, double bytes,
                           bool wait) {
    auto* issue = trace_->add_ops()->mutable_issue();
    issue->set_waited_at_issue(wait);
    auto* c = issue->add_collectives();
    c->set_kind(kind);
    for (int r : group) c->add_group(r);
    c->set_communicator("dp");
    c->set_sequence(++dp_sequence_);
    c->set_bytes(bytes);
    return static_cast<std::uint64_t>(trace_->ops_size() - 1);
  }

  void Wait(std::uint64_t issue) { trace_->add_ops()->mutable_wait()->set_issue(issue); }

 private:
  rp::RankTrace* trace_;
  std::uint64_t dp_sequence_ = 0;
};

const PhaseCost& Phase(const StepCosts& costs, const std::string& name) {
  auto it = costs.find(name);
  NEURON_CHECK(it != costs.end(), "the captured step has no phase ", name);
  return it->second;
}

// The parameters of a stage and, of them, its experts'.
struct StageParameters {
  double dense = 0, experts = 0;
};

class JobBuilder {
 public:
  // `dp`: the traces' data-parallel ranks (replicas x ep).
  JobBuilder(const StepCosts& costs, const proto::StepCapture& capture,
             const PredictedLayout& layout, int dp)
      : costs_(costs), capture_(capture), layout_(layout), dp_(dp),
        plan_(MakeSchedule(ScheduleKind::kOneForwardOneBackward, layout.pp,
                           layout.microbatches)) {}

  int Rank(Coordinates c) const { return c.p * (dp_ * layout_.tp) + c.d * layout_.tp + c.t; }

  rp::RankTrace Build(Coordinates c) const {
    rp::RankTrace trace;
    trace.set_rank(Rank(c));
    trace.set_world_size(layout_.tp * layout_.pp * dp_);
    // The replay's mesh: an ep x tp block of ranks per replica (TraceLayout).
    trace.mutable_layout()->set_tp(layout_.tp * layout_.ep);
    trace.mutable_layout()->set_pp(layout_.pp);
    trace.mutable_layout()->set_dp(dp_ / layout_.ep);
    if (layout_.ep > 1) trace.mutable_layout()->set_ep(layout_.ep);
    TraceWriter w(&trace);
    w.Mark("step_begin");
    for (const PipelineTask& task : plan_.order[static_cast<std::size_t>(c.p)]) {
      if (task.forward) {
        Forward(c, w);
      } else {
        Backward(c, w);
      }
    }
    Update(c, w);
    w.Mark("step_end");
    return trace;
  }

 private:
  bool First(Coordinates c) const { return c.p == 0; }
  bool Last(Coordinates c) const { return c.p == layout_.pp - 1; }
  int Layers(Coordinates c) const { return layout_.stage_layers[static_cast<std::size_t>(c.p)]; }
  double Us(const char* phase) const { return Phase(costs_, phase).total_us(); }

  // ZeRO-3: the stage's parameters all-gathered before each forward and
  // backward of a microbatch (and its gradients reduce-scattered after each
  // backward), blocking: a stage-sized FSDP unit, no prefetch.
  bool ShardsParameters() const { return layout_.zero >= 3; }

  // The rank's data-parallel group: every dp rank (`experts` false), or the
  // ranks holding the same experts (every ep-th).
  std::vector<int> DataGroup(Coordinates c, bool experts) const {
    std::vector<int> group;
    const int step = experts ? layout_.ep : 1;
    for (int d = c.d % step; d < dp_; d += step) group.push_back(Rank({c.t, d, c.p}));
    return group;
  }

  StageParameters Parameters(Coordinates c) const {
    const int s = c.p;
    const double experts = s < capture_.stage_expert_parameters_size()
                               ? static_cast<double>(capture_.stage_expert_parameters(s))
                               : 0;
    return {static_cast<double>(capture_.stage_parameters(s)) - experts, experts};
  }

  // One collective over the dense parameters' group and one over the
  // experts' (each where it has several ranks and something to move),
  // `bytes_per_parameter` each; waited at once.
  void OverBothGroups(Coordinates c, const char* kind, double bytes_per_parameter,
                      TraceWriter& w) const {
    const StageParameters p = Parameters(c);
    for (const bool experts : {false, true}) {
      const std::vector<int> group = DataGroup(c, experts);
      const double n = experts ? p.experts : p.dense;
      if (group.size() > 1 && n > 0) w.Collective(kind, group, n * bytes_per_parameter, true);
    }
  }

  void GatherParameters(Coordinates c, TraceWriter& w) const {
    if (ShardsParameters()) OverBothGroups(c, "allgather", layout_.parameter_bytes, w);
  }

  void Forward(Coordinates c, TraceWriter& w) const {
    if (!First(c)) w.Message(false, Rank({c.t, c.d, c.p - 1}), layout_.message_bytes);
    GatherParameters(c, w);
    w.Compute((First(c) ? Us("embed_forward") : 0) + Layers(c) * Us("layer_forward") +
              (Last(c) ? Us("head_forward") : 0));
    if (!Last(c)) w.Message(true, Rank({c.t, c.d, c.p + 1}), layout_.message_bytes);
  }

  void Backward(Coordinates c, TraceWriter& w) const {
    if (!Last(c)) w.Message(false, Rank({c.t, c.d, c.p + 1}), layout_.message_bytes);
    GatherParameters(c, w);
    w.Compute((Last(c) ? Us("head_backward") : 0) + Layers(c) * Us("layer_backward") +
              (First(c) ? Us("embed_backward") : 0));
    if (ShardsParameters()) OverBothGroups(c, "reducescatter", layout_.gradient_bytes, w);
    if (!First(c)) w.Message(true, Rank({c.t, c.d, c.p - 1}), layout_.message_bytes);
  }

  // The gradients of one group in 512 MB buckets (all-reduce; reduce-scatter
  // from ZeRO-1), issued without waiting; appends the issues to `issued`.
  void ReduceGradients(const std::vector<int>& group, double parameters, TraceWriter& w,
                       std::vector<std::uint64_t>& issued) const {
    if (group.size() < 2 || parameters <= 0) return;
    const double total = parameters * layout_.gradient_bytes;
    const int buckets = std::max(1, static_cast<int>(std::ceil(total / layout_.bucket_bytes)));
    for (int b = 0; b < buckets; ++b) {
      issued.push_back(w.Collective(layout_.zero >= 1 ? "reducescatter" : "allreduce", group,
                                    total / buckets, false));
    }
  }

  // The data-parallel reduction (the dense gradients over every dp rank,
  // then the experts' over their replicas), the optimizer and ZeRO's
  // all-gather.
  void Update(Coordinates c, TraceWriter& w) const {
    const std::int64_t parameters = capture_.stage_parameters(static_cast<int>(c.p));
    const StageParameters p = Parameters(c);
    const std::vector<int> group = DataGroup(c, false);
    if (!ShardsParameters()) {  // ZeRO-3 reduced each backward's
      std::vector<std::uint64_t> issued;
      ReduceGradients(group, p.dense, w, issued);
      ReduceGradients(DataGroup(c, true), p.experts, w, issued);
      for (auto i : issued) w.Wait(i);
    }
    if (group.size() > 1) w.Collective("allreduce", group, 4, true);  // the gradient norm
    w.Compute(Us(OptimizerPhase(parameters).c_str()));
    if (layout_.zero == 1 || layout_.zero == 2) {
      OverBothGroups(c, "allgather", layout_.parameter_bytes, w);
    }
  }

  const StepCosts& costs_;
  const proto::StepCapture& capture_;
  const PredictedLayout& layout_;
  const int dp_;
  const PipelinePlan plan_;
};

}  // namespace

std::string OptimizerPhase(std::int64_t parameters) {
  return "optimizer_" + std::to_string(parameters);
}

std::vector<rp::RankTrace> PredictedTraces(const StepCosts& costs,
                                           const proto::StepCapture& capture,
                                           const PredictedLayout& layout) {
  NEURON_CHECK(layout.tp >= 1 && layout.pp >= 1 && layout.dp >= 1 && layout.microbatches >= 1,
               "predicted job: tp, pp, dp and microbatches must be at least 1 (got ", layout.tp,
               ", ", layout.pp, ", ", layout.dp, ", ", layout.microbatches, ")");
  NEURON_CHECK(static_cast<int>(layout.stage_layers.size()) == layout.pp &&
                   capture.stage_parameters_size() == layout.pp,
               "predicted job: ", layout.stage_layers.size(), " stage layer counts and ",
               capture.stage_parameters_size(), " captured stages for pp ", layout.pp);
  NEURON_CHECK(layout.bucket_bytes > 0, "predicted job: bucket_bytes must be positive");
  NEURON_CHECK(layout.ep >= 1 && layout.dp % layout.ep == 0, "predicted job: ep ",
               layout.ep, " does not divide dp ", layout.dp);
  NEURON_CHECK(capture.stage_expert_parameters_size() == 0 ||
                   capture.stage_expert_parameters_size() == layout.pp,
               "predicted job: ", capture.stage_expert_parameters_size(),
               " captured stages of experts for pp ", layout.pp);
  const int dp = std::min(layout.dp / layout.ep, 2) * layout.ep;  // replicas x ep
  JobBuilder builder(costs, capture, layout, dp);
  std::vector<rp::RankTrace> traces(static_cast<std::size_t>(layout.tp * layout.pp * dp));
  for (int p = 0; p < layout.pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < layout.tp; ++t) {
        const Coordinates c{t, d, p};
        traces[static_cast<std::size_t>(builder.Rank(c))] = builder.Build(c);
      }
    }
  }
  return traces;
}

}  // namespace neuron::parallel
