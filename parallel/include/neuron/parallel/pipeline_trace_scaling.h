// Traces of a job at another pipeline-parallel size, made from one
// recording of it (docs/scaling.md, "Other pipeline sizes"): what lets
// `neuronrun replay --pp` and the scaling matrix model a pipeline deeper
// than a job small enough to run here.
//
// The recorded stages mark their structure (op_trace.proto's
// TracePipelineMark and TracePipeline, which torchneuron.parallel's
// PipelineEngine records for chunks made by pipeline.partition): each
// task, and each layer's forward and backward of each microbatch. A
// layer's work on a microbatch (its compute charges and its collectives
// within the stage, such as tensor parallelism's) is the same on whichever
// stage runs it. The new job partitions the layers again (BalancedPartition
// of the recorded costs into pp x chunks parts), runs each stage's tasks in
// MakeSchedule's order with each layer's recorded work, and sends the
// activations and gradients between stages as the engine does (a header,
// then the layer input's bytes). The rest of a step, before the first task
// and after the waits for the last sends, and what runs outside the steps
// come from the recorded stage of the same kind (the first, the last, else
// the second), with its data-parallel gradient all-reduce resized to the
// new stage's layers. A group holding one stage holds the rank's new
// stage; one spanning the pipeline axis spans the new one. The tp and dp
// sizes are the recording's (ReplayTraces scales dp, ScaleTensorParallel
// tp).
//
// Usage:
//   auto traces = ScalePipeline(LoadJobTraces("pp2"), 8);
//   ReplayResult r = ReplayTraces(traces, model);   // the job at pp=8
#pragma once

#include <vector>

#include "neuron/runtime/op_trace.pb.h"

namespace neuron::parallel {

// InvalidUsage names what cannot be scaled: traces that are not a job
// (CheckJobTraces); pp below the recording's (a stage would hold more
// gradient bytes, which byte-capped buckets may split into more
// collectives) or more parts than layers; a recording without the pipeline
// plan or at pp 1; and the rank and op where a stage's program does not
// follow its schedule and partition, a layer's work waits for an op
// outside it or holds a message, a group spans part of the pipeline axis,
// or a stage's gradients are not one all-reduce at the end of its step.
std::vector<runtime::proto::RankTrace> ScalePipeline(
    const std::vector<runtime::proto::RankTrace>& traces, int pp);

}  // namespace neuron::parallel
