// Scaling a recorded pipeline job to another pipeline size
// (parallel/pipeline_trace_scaling.h): a job run on threads as
// PipelineEngine runs one (its schedule's tasks, each layer's compute and
// tensor-parallel all-reduces, a header and data between stages, the
// stage's gradient all-reduce), recorded at one pp and scaled to another,
// replays to what the other really models; what cannot be scaled is
// refused with the rank and op.
#include "neuron/parallel/pipeline_trace_scaling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../collectives/rank_threads.h"
#include "../collectives/traced_rank.h"
#include "../runtime/error_of.h"
#include "../runtime/trn2_nodes.h"
#include "neuron/collectives/async_communicator.h"
#include "neuron/parallel/pipeline_schedule.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/trace_replay.h"
#include "neuron/runtime/fabric/trace_scaling.h"

namespace neuron::parallel {
namespace {

using collectives::AsyncCommunicator;
using collectives::Communicator;
using collectives::DataType;
using runtime::SimDuration;
using runtime::proto::TracePipelineMark;
using runtime::testing::ErrorOf;
using runtime::testing::Trn2Nodes;

constexpr int kSteps = 2, kLayers = 8, kMicrobatches = 4, kHeader = 112;

// The model: an embedding, six blocks and a head; a block's forward costs
// 10 us and all-reduces its output over tensor parallelism.
double Cost(int k) { return k == 0 ? 3 : (k == kLayers - 1 ? 4 : 10); }
double Gradient(int k) { return k == 0 ? 2048 : (k == kLayers - 1 ? 1024 : 4096); }
// At tensor-parallel size tp, a layer's compute and gradients shrink so
// (Amdahl: a replicated part and a sharded one).
double Sharded(double v, int tp, double replicated) {
  return v * (replicated + (1 - replicated) / tp);
}
int InputBytes(int k) { return k == 0 ? 256 : 4096; }

struct Shape {
  int tp = 2, pp = 2, dp = 2, chunks = 1;
  std::string schedule = "1f1b";
  int world() const { return tp * pp * dp; }
};

struct Job {
  std::vector<runtime::proto::RankTrace> traces;
  double slowest_step_us = 0;  // the last step's, over the ranks
};

// One rank of the job, on its thread.
class StageRank {
 public:
  StageRank(collectives::Store& store, int rank, const Shape& shape)
      : shape_(shape),
        traced_(store, rank, shape.world()),
        t_(rank % shape.tp),
        d_((rank / shape.tp) % shape.dp),
        p_(rank / (shape.tp * shape.dp)),
        tp_comm_(traced_.world->Split(p_ * shape.dp + d_, rank)),
        dp_comm_(traced_.world->Split(p_ * shape.tp + t_, rank)) {
    std::vector<double> costs;
    for (int k = 0; k < kLayers; ++k) costs.push_back(Cost(k));
    starts_ = BalancedPartition(costs, shape.pp * shape.chunks);
    plan_.set_schedule(shape.schedule);
    plan_.set_microbatches(kMicrobatches);
    plan_.set_chunks(shape.chunks);
    for (double c : costs) plan_.add_layer_costs(c);
    for (int c = 0; c < shape.chunks; ++c) {
      for (int k = starts_[c * shape.pp + p_]; k < starts_[c * shape.pp + p_ + 1]; ++k) {
        auto* layer = plan_.add_layers();
        layer->set_chunk(c);
        layer->set_index(k);
        layer->set_gradient_bytes(Sharded(Gradient(k), shape.tp, 0.5));
        stage_gradient_ += Sharded(Gradient(k), shape.tp, 0.5);
      }
    }
  }

  double Step() {
    auto& clock = *traced_.clock;
    const double begin = clock.compute().count();
    traced_.trace->SetPipeline(plan_);
    traced_.trace->Mark("step_begin");
    const auto order = MakeSchedule(ParseScheduleKind(shape_.schedule), shape_.pp,
                                    kMicrobatches, shape_.chunks)
                           .order[static_cast<std::size_t>(p_)];
    std::vector<std::shared_ptr<collectives::Work>> sends;
    for (const PipelineTask& task : order) Task(task, sends);
    for (auto& w : sends) w->Wait();
    std::vector<float> grads(static_cast<std::size_t>(stage_gradient_ / 4), 1.0f);
    OnGroup(dp_comm_, [&](Communicator& c) {
      c.AllReduce({grads.data(), grads.size(), DataType::kFloat32});
    });
    traced_.trace->Mark("step_end");
    const double advance = clock.compute().count() - begin;
    OnGroup(world_, [](Communicator& c) { c.Barrier(); });
    return advance;
  }

  runtime::proto::RankTrace Trace(int rank) const {
    runtime::proto::TraceLayout layout;
    layout.set_tp(shape_.tp);
    layout.set_pp(shape_.pp);
    layout.set_dp(shape_.dp);
    return traced_.trace->Snapshot(rank, shape_.world(), layout);
  }

 private:
  static void OnGroup(AsyncCommunicator& group, std::function<void(Communicator&)> f) {
    group.Enqueue(std::move(f))->Wait();
  }

  void Mark(TracePipelineMark::Kind kind, const PipelineTask& task, int vs) {
    traced_.trace->Mark(runtime::TaskMark(kind, task.forward, task.microbatch, vs));
  }

  void Task(const PipelineTask& task,
            std::vector<std::shared_ptr<collectives::Work>>& sends) {
    const int v = shape_.pp * shape_.chunks, vs = task.chunk * shape_.pp + p_;
    const int first = starts_[vs], end = starts_[vs + 1];
    Mark(TracePipelineMark::TASK_BEGIN, task, vs);
    if (task.forward && vs > 0) Tensor(false, vs - 1, InputBytes(first), task, vs);
    if (!task.forward && vs < v - 1) Tensor(false, vs + 1, InputBytes(end), task, vs + 1);
    for (int n = 0; n < end - first; ++n) {
      const int k = task.forward ? first + n : end - 1 - n;
      traced_.trace->Mark(runtime::LayerMark(k, task.forward, task.microbatch,
                                             task.forward ? InputBytes(k) : 0));
      traced_.clock->AdvanceCompute(
          SimDuration((task.forward ? 1 : 2) * Sharded(Cost(k), shape_.tp, 0.25)));
      if (shape_.tp > 1 && k > 0 && k < kLayers - 1) {
        OnGroup(tp_comm_, [&](Communicator& c) {
          c.AllReduce({activations_.data(), activations_.size(), DataType::kFloat32});
        });
      }
    }
    Mark(TracePipelineMark::TASK_END, task, vs);
    std::vector<std::shared_ptr<collectives::Work>> works;
    if (task.forward && vs < v - 1)
      works = Tensor(true, vs + 1, InputBytes(end), task, vs + 1);
    if (!task.forward && vs > 0)
      works = Tensor(true, vs - 1, InputBytes(first), task, vs);
    sends.insert(sends.end(), works.begin(), works.end());
  }

  // A header and `bytes` of data to or from virtual stage `peer_vs`
  // (receives waited for at once); `boundary`: the later stage's index.
  std::vector<std::shared_ptr<collectives::Work>> Tensor(bool send, int peer_vs,
                                                         int bytes,
                                                         const PipelineTask& task,
                                                         int boundary) {
    const int peer = (peer_vs % shape_.pp) * shape_.tp * shape_.dp + d_ * shape_.tp + t_;
    const int tag = ((task.microbatch * 64 + boundary) * 2 + (task.forward ? 0 : 1)) * 2;
    std::vector<std::shared_ptr<collectives::Work>> works;
    for (int part = 0; part < 2; ++part) {
      const std::size_t size = part == 0 ? kHeader : static_cast<std::size_t>(bytes);
      auto* buffer = send ? send_buffer_.data() : recv_buffer_.data();
      works.push_back(world_.Enqueue(
          [=](Communicator& c) {
            if (send) {
              c.Send(peer, buffer, size, tag + part);
            } else {
              c.Recv(peer, buffer, size, tag + part);
            }
          },
          send ? "send" : "recv", AsyncCommunicator::Lane::kPointToPoint));
      if (!send) works.back()->Wait();
    }
    return works;
  }

  Shape shape_;
  collectives::testing::TracedRank traced_;
  int t_, d_, p_;
  AsyncCommunicator tp_comm_, dp_comm_;
  AsyncCommunicator world_{std::move(traced_.world)};
  std::vector<int> starts_;
  runtime::proto::TracePipeline plan_;
  double stage_gradient_ = 0;
  std::vector<float> activations_ = std::vector<float>(1024, 1.0f);
  std::vector<char> send_buffer_ = std::vector<char>(8192), recv_buffer_ = send_buffer_;
};

Job RunJob(const Shape& shape) {
  Job job;
  job.traces.resize(static_cast<std::size_t>(shape.world()));
  std::vector<double> step_us(static_cast<std::size_t>(shape.world()));
  collectives::testing::RunRanks(shape.world(), [&](int rank, collectives::Store& store) {
    StageRank r(store, rank, shape);
    for (int step = 0; step < kSteps; ++step) step_us[rank] = r.Step();
    job.traces[rank] = r.Trace(rank);
  });
  job.slowest_step_us = *std::max_element(step_us.begin(), step_us.end());
  return job;
}


double Replayed(const std::vector<runtime::proto::RankTrace>& traces, int world) {
  return runtime::ReplayTraces(traces, Trn2Nodes(world)).steps.back().modelled_us;
}

// The first op where the traces differ in kind, compute charge, wait or
// first message's peer and bytes; -1 if none does.
int FirstDifference(const runtime::proto::RankTrace& x,
                    const runtime::proto::RankTrace& y) {
  for (int i = 0; i < std::min(x.ops_size(), y.ops_size()); ++i) {
    const auto &a = x.ops(i), &b = y.ops(i);
    const auto &m = a.issue().messages(), &n = b.issue().messages();
    if (a.op_case() != b.op_case() || a.compute().us() != b.compute().us() ||
        a.wait().issue() != b.wait().issue() || m.size() != n.size() ||
        (!m.empty() && (m[0].peer() != n[0].peer() || m[0].bytes() != n[0].bytes()))) {
      return i;
    }
  }
  return x.ops_size() == y.ops_size() ? -1 : std::min(x.ops_size(), y.ops_size());
}

void ExpectScaledReplaysToRealRun(Shape from, int pp) {
  const Job recorded = RunJob(from);
  Shape to = from;
  to.pp = pp;
  const Job real = RunJob(to);
  const auto scaled = ScalePipeline(recorded.traces, pp);
  ASSERT_EQ(scaled.size(), real.traces.size());
  for (std::size_t r = 0; r < scaled.size(); ++r) {
    EXPECT_EQ(FirstDifference(scaled[r], real.traces[r]), -1) << "rank " << r;
    EXPECT_EQ(scaled[r].layout().pp(), pp);
    EXPECT_EQ(scaled[r].pipeline().layers_size(),
              real.traces[r].pipeline().layers_size());
  }
  const double want = Replayed(real.traces, to.world());
  EXPECT_NEAR(want, real.slowest_step_us, 1e-6 * want);
  EXPECT_NEAR(Replayed(scaled, to.world()), want, 1e-6 * want);
}

TEST(PipelineTraceScaling, ARecordingScaledToMoreStagesReplaysToTheirRealRun) {
  {
    SCOPED_TRACE("1f1b, tp 2 x dp 2: pp 2 -> 4");
    ExpectScaledReplaysToRealRun({}, 4);
  }
  {
    SCOPED_TRACE("gpipe, one replica: pp 2 -> 8 (a layer a stage)");
    ExpectScaledReplaysToRealRun({2, 2, 1, 1, "gpipe"}, 8);
  }
  {
    SCOPED_TRACE("interleaved, two chunks a stage: pp 2 -> 4");
    ExpectScaledReplaysToRealRun({1, 2, 2, 2, "interleaved"}, 4);
  }
}

TEST(PipelineTraceScaling, TensorParallelismScaledFirstThenThePipeline) {
  // One replica at tp 2 and tp 8 on 2 stages, scaled to tp 4
  // (runtime::ScaleTensorParallel), then to 4 stages: the real run.
  const Job tp2 = RunJob({2, 2, 1}), tp8 = RunJob({8, 2, 1}), real = RunJob({4, 4, 1});
  const auto scaled =
      ScalePipeline(runtime::ScaleTensorParallel(tp2.traces, tp8.traces, 4), 4);
  ASSERT_EQ(scaled.size(), real.traces.size());
  const double want = Replayed(real.traces, 16);
  EXPECT_NEAR(want, real.slowest_step_us, 1e-6 * want);
  EXPECT_NEAR(Replayed(scaled, 16), want, 1e-6 * want);
}

TEST(PipelineTraceScaling, RefusesWhatItCannotScale) {
  const Job pp2 = RunJob({});
  EXPECT_NE(ErrorOf([&] {
              ScalePipeline(pp2.traces, 1);
            }).find("cannot scale to pp=1, below the recording's pp=2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              ScalePipeline(pp2.traces, 16);
            }).find("16 stages of 1 chunks need more than the model's 8 layers"),
            std::string::npos);
  auto no_plan = pp2.traces;
  no_plan[3].clear_pipeline();
  EXPECT_NE(ErrorOf([&] {
              ScalePipeline(no_plan, 4);
            }).find("rank 3's trace has no pipeline plan"),
            std::string::npos);
  auto huge = pp2.traces;  // a plan no trace of this size can have run
  huge[2].mutable_pipeline()->set_microbatches(1 << 30);
  EXPECT_NE(
      ErrorOf([&] { ScalePipeline(huge, 4); })
          .find("rank 2's pipeline plan is not one its trace can have run (1073741824 "
                "microbatches"),
      std::string::npos);
  auto reordered = pp2.traces;  // rank 5's first task claims another microbatch
  auto& ops = *reordered[5].mutable_ops();
  std::vector<int> tasks;
  for (int i = 0; i < ops.size(); ++i) {
    if (ops[i].mark().pipeline().kind() == TracePipelineMark::TASK_BEGIN &&
        ops[i].mark().has_pipeline()) {
      tasks.push_back(i);
    }
  }
  ops[tasks[0]].mutable_mark()->mutable_pipeline()->set_microbatch(1);
  const std::string schedule = ErrorOf([&] { ScalePipeline(reordered, 4); });
  EXPECT_NE(schedule.find("rank 5, op " + std::to_string(tasks[0]) +
                          ": a forward of microbatch 1 on virtual stage 1 where the "
                          "schedule has a forward of microbatch 0 on virtual stage 1"),
            std::string::npos)
      << schedule;
  auto bucketed = pp2.traces;  // rank 0's gradients as if in two buckets
  double gradient = 0;
  for (const auto& layer : bucketed[0].pipeline().layers())
    gradient += layer.gradient_bytes();
  for (auto& op : *bucketed[0].mutable_ops()) {
    if (!op.has_issue()) continue;
    for (auto& c : *op.mutable_issue()->mutable_collectives()) {
      if (c.bytes() == gradient) c.set_bytes(gradient / 2);
    }
  }
  const std::string buckets = ErrorOf([&] { ScalePipeline(bucketed, 4); });
  EXPECT_NE(
      buckets.find("ranks 4 and 0 differ outside the pipeline's tasks (step 0 after "
                   "its tasks, op "),
      std::string::npos)
      << buckets;
}

}  // namespace
}  // namespace neuron::parallel
