// A recorded pipeline stage's trace cut into the parts that a job at
// another pipeline size is reassembled from (pipeline_trace_scaling.h):
// what runs before, between and after the steps, and in each step the
// stage's work before its first task, each layer's work on each
// microbatch, and the step's end after its last task. Internal to
// parallel/src.
//
// A step of a stage reads (op_trace.proto's marks):
//   step_begin, head, then the schedule's tasks, each:
//     TASK_BEGIN, its receives (an issue and a wait per message),
//     per layer: LAYER_BEGIN, the layer's work,
//     TASK_END, its sends (issues),
//   the waits for the step's sends, the epilogue, step_end.
#pragma once

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "neuron/parallel/pipeline_schedule.h"
#include "neuron/runtime/fabric/trace_job.h"
#include "neuron/runtime/op_trace.pb.h"

namespace neuron::parallel::trace_parts {

// Consecutive recorded ops; a wait's issue is an index into `ops`.
struct Region {
  std::vector<runtime::proto::TraceOp> ops;
};

// Which layer, which microbatch, which direction.
struct LayerKey {
  int layer = 0, microbatch = 0;
  bool forward = true;
  bool operator<(const LayerKey& o) const {
    return std::tie(layer, microbatch, forward) <
           std::tie(o.layer, o.microbatch, o.forward);
  }
};

// One layer's forward or backward of one microbatch: its mark (a forward's
// holds the layer input's bytes) and its work; `before` its mark, the
// loss's backward (the last virtual stage's backward begins with it, then
// the model's last layer).
struct LayerWork {
  runtime::proto::TraceMark mark;
  Region before, work;
};

struct Step {
  Region head;      // after step_begin, before the first task
  Region epilogue;  // after the waits for the sends, before step_end
  Region after;     // after step_end, before the next step_begin (or the end)
  runtime::proto::TraceOp begin, end;  // the step's marks
  std::map<LayerKey, LayerWork> layers;
};

struct Stage {
  Region preamble;  // before the first step_begin
  std::vector<Step> steps;
  // Of the stage tensors it sent and received: their headers' sizes and
  // the communicator they went over.
  std::set<double> header_bytes;
  std::string communicator;
};

// The layers of each virtual stage (chunk * pp + stage) when `plan`'s
// layers are split into pp x chunks parts by their costs: the first layer
// of each, then the layer count.
std::vector<int> Partition(const runtime::proto::TracePipeline& plan, int pp);

// The layers stage `stage` holds, chunk by chunk, under partition `starts`.
std::vector<int> StageLayers(const std::vector<int>& starts, int pp, int chunks,
                             int stage);

// Cuts a recorded stage's trace (rank `trace.rank()` of `mesh`) whose
// virtual stages hold the layers `starts` gives and whose tasks run in
// `order` (MakeSchedule's for its stage), checking that they do, and that
// each task receives and sends the stage tensors its place needs (a
// header and the data, from and to the neighbouring stage). InvalidUsage
// names the rank and op where it does not, or where a layer's work waits
// for an op outside it or holds a message or a mark.
Stage CutStage(const runtime::proto::RankTrace& trace, const runtime::Mesh& mesh,
               const std::vector<int>& starts, const std::vector<PipelineTask>& order);

}  // namespace neuron::parallel::trace_parts
