#include "pipeline_trace_parts.h"

#include <cmath>
#include <set>

#include "neuron/runtime/error.h"

namespace neuron::parallel::trace_parts {

namespace {

using runtime::proto::TraceOp;
using runtime::proto::TracePipelineMark;

bool IsMark(const TraceOp& op, const char* name) {
  return op.has_mark() && !op.mark().has_pipeline() && op.mark().name() == name;
}

bool IsPipeline(const TraceOp& op, TracePipelineMark::Kind kind) {
  return op.has_mark() && op.mark().has_pipeline() && op.mark().pipeline().kind() == kind;
}

// An issue of messages, every one a send (or every one a receive).
bool IsMessages(const TraceOp& op, bool send) {
  if (!op.has_issue() || !op.issue().messages_lane() || op.issue().messages_size() == 0) {
    return false;
  }
  for (const auto& m : op.issue().messages()) {
    if (m.send() != send) return false;
  }
  return true;
}

const char* TaskName(bool forward) { return forward ? "forward" : "backward"; }

// Walks one stage's ops, cutting them into a Stage.
class Cutter {
 public:
  Cutter(const runtime::proto::RankTrace& trace, const runtime::Mesh& mesh,
         const std::vector<int>& starts, const std::vector<PipelineTask>& order)
      : trace_(trace),
        mesh_(mesh),
        ops_(trace.ops()),
        p_(mesh.Pipeline(trace.rank())),
        starts_(starts),
        order_(order) {}

  Stage Cut() {
    Stage stage;
    stage.preamble =
        Take(Until([](const TraceOp& op) { return IsMark(op, "step_begin"); }));
    Check(i_ < n(), "no step_begin mark");
    while (i_ < n()) stage.steps.push_back(StepAt(stage));
    return stage;
  }

 private:
  int n() const { return ops_.size(); }

  [[noreturn]] void Fail(const std::string& what) const {
    throw InvalidUsage(StrCat("rank ", trace_.rank(), ", op ", i_, ": ", what));
  }
  // The message is built only when `ok` is false.
  template <typename... What>
  void Check(bool ok, const What&... what) const {
    if (!ok) Fail(StrCat(what...));
  }

  // Advances to the first op from here that `stop` accepts (or the end);
  // returns where it started.
  template <typename Stop>
  int Until(Stop stop) {
    const int begin = i_;
    while (i_ < n() && !stop(ops_[i_])) ++i_;
    return begin;
  }

  // Ops [begin, i_) as a Region, their waits numbered within it.
  Region Take(int begin) const { return Take(begin, i_); }
  Region Take(int begin, int end) const {
    Region region;
    for (int k = begin; k < end; ++k) {
      TraceOp op = ops_[k];
      if (op.has_wait()) {
        const auto issue = op.wait().issue();
        if (issue < static_cast<std::uint64_t>(begin) ||
            issue >= static_cast<std::uint64_t>(k)) {
          throw InvalidUsage(StrCat(
              "rank ", trace_.rank(), ", op ", k, ": a wait for op ", issue,
              ", outside its part of the step (ops ", begin, " to ", end - 1, ")"));
        }
        op.mutable_wait()->set_issue(issue - static_cast<std::uint64_t>(begin));
      }
      region.ops.push_back(std::move(op));
    }
    return region;
  }

  Step StepAt(Stage& stage) {
    Step step;
    step.begin = ops_[i_++];
    auto task_or_end = [](const TraceOp& op) {
      return IsPipeline(op, TracePipelineMark::TASK_BEGIN) || IsMark(op, "step_end") ||
             IsMark(op, "step_begin");
    };
    step.head = Take(Until(task_or_end));
    sends_.clear();
    tasks_ = 0;
    while (i_ < n() && IsPipeline(ops_[i_], TracePipelineMark::TASK_BEGIN)) {
      TaskAt(stage, step);
    }
    Check(tasks_ == order_.size(), "the step ran ", tasks_,
          " pipeline tasks where its schedule has ", order_.size());
    while (i_ < n() && ops_[i_].has_wait() && sends_.count(ops_[i_].wait().issue())) ++i_;
    const int epilogue = Until([](const TraceOp& op) {
      return IsMark(op, "step_end") || IsMark(op, "step_begin") ||
             op.mark().has_pipeline();
    });
    Check(i_ < n() && IsMark(ops_[i_], "step_end"),
          "the step does not end after its tasks");
    step.epilogue = Take(epilogue);
    step.end = ops_[i_++];
    step.after = Take(Until([](const TraceOp& op) { return IsMark(op, "step_begin"); }));
    return step;
  }

  void TaskAt(Stage& stage, Step& step) {
    const TracePipelineMark task = ops_[i_].mark().pipeline();
    Check(tasks_ < order_.size(), "more pipeline tasks than the schedule has");
    const PipelineTask& want = order_[tasks_++];
    const int vs = want.chunk * mesh_.pp + p_;
    Check(task.forward() == want.forward && task.microbatch() == want.microbatch &&
              task.virtual_stage() == vs,
          "a ", TaskName(task.forward()), " of microbatch ", task.microbatch(),
          " on virtual stage ", task.virtual_stage(), " where the schedule has a ",
          TaskName(want.forward), " of microbatch ", want.microbatch,
          " on virtual stage ", vs);
    ++i_;
    const int v = static_cast<int>(starts_.size()) - 1;  // virtual stages
    const bool from_previous = task.forward() && vs > 0;
    const bool from_next = !task.forward() && vs < v - 1;
    Messages(stage, false,
             from_previous || from_next ? vs + (from_previous ? -1 : 1) : -1);
    const int lead = i_;
    Until([](const TraceOp& op) { return op.mark().has_pipeline(); });
    Check(lead == i_ || (!task.forward() && vs == v - 1),
          "work before the task's first layer (only the last virtual stage's backward, "
          "the loss's, may have some)");
    LayersOf(step, task, vs, lead);
    Check(i_ < n() && IsPipeline(ops_[i_], TracePipelineMark::TASK_END) &&
              ops_[i_].mark().pipeline().forward() == task.forward() &&
              ops_[i_].mark().pipeline().microbatch() == task.microbatch() &&
              ops_[i_].mark().pipeline().virtual_stage() == vs,
          "the task's layers are not followed by its TASK_END mark");
    ++i_;
    const int sends = i_;
    const bool to_next = task.forward() && vs < v - 1,
               to_previous = !task.forward() && vs > 0;
    Messages(stage, true, to_next || to_previous ? vs + (to_next ? 1 : -1) : -1);
    for (int k = sends; k < i_; ++k) sends_.insert(static_cast<std::uint64_t>(k));
  }

  // The task's stage tensor received (each issue followed by its wait) or
  // sent: a header and the data, to or from virtual stage `peer_vs` (-1:
  // none).
  void Messages(Stage& stage, bool send, int peer_vs) {
    std::vector<const runtime::proto::TraceMessage*> messages;
    while (i_ < n() && IsMessages(ops_[i_], send)) {
      for (const auto& m : ops_[i_].issue().messages()) messages.push_back(&m);
      ++i_;
      if (send) continue;
      Check(i_ < n() && ops_[i_].has_wait() &&
                ops_[i_].wait().issue() == static_cast<std::uint64_t>(i_ - 1),
            "a stage tensor's receive is not waited for at once");
      ++i_;
    }
    const int peer = peer_vs < 0
                         ? -1
                         : mesh_.Rank(mesh_.Tensor(trace_.rank()), peer_vs % mesh_.pp,
                                      mesh_.Data(trace_.rank()));
    const std::size_t want = peer < 0 ? 0 : 2;
    bool right = messages.size() == want;
    for (const auto* m : messages) right = right && m->peer() == peer;
    if (!right) {
      Fail(StrCat("the task ", send ? "sends " : "receives ", messages.size(),
                  " messages where its schedule has ", want,
                  peer < 0 ? "" : StrCat(" (a header and the data, rank ", peer, ")")));
    }
    if (peer >= 0) {
      stage.header_bytes.insert(messages[0]->bytes());
      stage.communicator = messages[0]->communicator();
    }
  }

  // The task's layers, each from its LAYER_BEGIN mark to the next mark (the
  // first one's work from `lead`, before its mark, too).
  void LayersOf(Step& step, const TracePipelineMark& task, int vs, int lead) {
    const int first = starts_[static_cast<std::size_t>(vs)];
    const int last = starts_[static_cast<std::size_t>(vs) + 1] - 1;
    for (int k = 0; k <= last - first; ++k) {
      const int layer = task.forward() ? first + k : last - k;
      Check(i_ < n() && IsPipeline(ops_[i_], TracePipelineMark::LAYER_BEGIN),
            "the task's layer ", layer, " has no LAYER_BEGIN mark here");
      const auto& mark = ops_[i_].mark();
      const int before = k == 0 ? lead : i_, at = i_;
      Check(mark.pipeline().layer() == layer &&
                mark.pipeline().forward() == task.forward() &&
                mark.pipeline().microbatch() == task.microbatch(),
            "the mark of layer ", mark.pipeline().layer(), " where the partition has ",
            TaskName(task.forward()), " layer ", layer, " of microbatch ",
            task.microbatch());
      const double input = mark.pipeline().input_bytes();
      Check(std::isfinite(input) && input >= 0, "layer ", layer, "'s input of ", input,
            " bytes");
      ++i_;
      const int work = Until([](const TraceOp& op) { return op.mark().has_pipeline(); });
      for (int w = before; w < i_; ++w) {
        if (w != at && (ops_[w].issue().messages_size() > 0 || ops_[w].has_mark())) {
          throw InvalidUsage(StrCat("rank ", trace_.rank(), ", op ", w, ": layer ", layer,
                                    "'s work holds a message or a mark"));
        }
      }
      step.layers[{layer, task.microbatch(), task.forward()}] = {mark, Take(before, at),
                                                                 Take(work)};
    }
  }

  const runtime::proto::RankTrace& trace_;
  const runtime::Mesh& mesh_;
  const google::protobuf::RepeatedPtrField<TraceOp>& ops_;
  int p_;
  std::vector<int> starts_;
  std::vector<PipelineTask> order_;
  int i_ = 0;
  std::size_t tasks_ = 0;
  std::set<std::uint64_t> sends_;  // this step's send issues
};

}  // namespace

std::vector<int> Partition(const runtime::proto::TracePipeline& plan, int pp) {
  const std::vector<double> costs(plan.layer_costs().begin(), plan.layer_costs().end());
  return BalancedPartition(costs, pp * plan.chunks());
}

std::vector<int> StageLayers(const std::vector<int>& starts, int pp, int chunks,
                             int stage) {
  std::vector<int> layers;
  for (int c = 0; c < chunks; ++c) {
    const auto vs = static_cast<std::size_t>(c * pp + stage);
    for (int k = starts[vs]; k < starts[vs + 1]; ++k) layers.push_back(k);
  }
  return layers;
}

Stage CutStage(const runtime::proto::RankTrace& trace, const runtime::Mesh& mesh,
               const std::vector<int>& starts, const std::vector<PipelineTask>& order) {
  return Cutter(trace, mesh, starts, order).Cut();
}

}  // namespace neuron::parallel::trace_parts
