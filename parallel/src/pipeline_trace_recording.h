// A recorded pipeline job as ScalePipeline reads it
// (pipeline_trace_scaling.h): its mesh and plan, the partition its stages
// ran, each stage's trace cut into parts (pipeline_trace_parts.h), checked
// first. Internal to parallel/src.
#pragma once

#include <map>
#include <vector>

#include "neuron/runtime/fabric/trace_job.h"
#include "neuron/runtime/op_trace.pb.h"
#include "pipeline_trace_parts.h"

namespace neuron::parallel::trace_parts {

struct Recording {
  runtime::Mesh mesh{1, 1, 1};
  runtime::proto::TracePipeline plan;           // every rank's schedule, chunks and costs
  std::vector<int> starts;                      // the partition the stages ran
  std::vector<Stage> stages;                    // by rank
  std::vector<std::map<int, double>> gradient;  // by rank: layer -> gradient bytes
  double header_bytes = 0;                      // of every stage tensor

  // The recorded stage that ran layer k.
  int Owner(int k) const;
  // The gradient bytes of rank r's stage, and of layer k at (t, d).
  double StageGradient(int r) const;
  double LayerGradient(int t, int d, int k) const;
};

// Reads a recorded job. InvalidUsage names what cannot be read: traces
// that are not a job (CheckJobTraces), pp 1, a rank without the pipeline
// plan, plans that differ or whose figures the traces cannot have run
// (microbatches, chunks, more than kMaxLayers layers, non-finite costs),
// layers that do not tile the model, a stage's trace that does not follow
// its schedule and partition (CutStage), steps or stage-tensor headers
// that differ between ranks, and work outside the tasks that differs
// between stages (the rank and op; only the one all-reduce of a stage's
// gradients may), since every new stage repeats the first stage's.
Recording ReadRecording(const std::vector<runtime::proto::RankTrace>& traces);

// Whether `c` is the all-reduce of a stage's `bytes` > 0 of gradients
// (equal but for rounding when ScaleTensorParallel fitted both).
bool IsGradientAllReduce(const runtime::proto::TraceCollective& c, double bytes);

constexpr int kMaxLayers = 1024;  // BalancedPartition takes time of their cube

}  // namespace neuron::parallel::trace_parts
