// Replays the operation traces of a job (op_trace.proto) through the device
// and fabric models, on the job's own topology or on a larger one: what
// `neuronrun matrix` does for cells too large to run as processes
// (docs/scaling.md, "Modelled cells").
//
// Each rank re-runs its trace with the clock rules of a real run
// (docs/architecture.md, "Two clocks"): compute charges advance its compute
// stream; an issued collective starts at max(issue time, the end of its
// communicator's previous collective) plus the rank's straggler delay,
// waits for every member, and lasts what ModelCollective says on the target
// fabric; a receive completes at max(issue time, the send's issue time + the
// modelled transfer); a wait joins the compute stream to the end of what it
// waits for. Replayed on the recorded job's own topology, it reproduces the
// real run's modelled step times.
//
// A larger job (more data-parallel replicas, the same tp x pp) maps each
// rank to the recorded rank at the same tensor and pipeline position and
// data-parallel index modulo the recorded count; a group that spans the
// recorded data-parallel axis spans the whole new one, at the same sizes
// (weak scaling: per-rank work is the recorded rank's). An expert-parallel
// job's replicas are its ranks' blocks of ep x tp (TraceLayout): a larger
// job adds replicas, keeping ep.
//
// Usage:
//   std::vector<proto::RankTrace> traces = LoadJobTraces("cell/trace");
//   FabricModel model(ultraserver, PlaceRanks(ultraserver, {16, 16, 16, 16}));
//   ReplayResult r = ReplayTraces(traces, model);
//   r.steps[1].modelled_us
#pragma once

#include <map>
#include <string>
#include <vector>

#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/op_trace.pb.h"

namespace neuron::runtime {

// One training step, between a "step_begin" and a "step_end" mark.
struct ReplayedStep {
  double modelled_us = 0;  // the slowest rank's clock advance
  // The slowest rank's breakdown: its compute charges, and the time its
  // compute stream waited for collectives and for messages (in a pipeline,
  // mostly the bubble); with straggler delays they need not add up.
  double compute_us = 0;
  double collective_wait_us = 0;
  double message_wait_us = 0;
  std::map<std::string, double> rank0_bytes;  // per collective kind, issued by rank 0
};

struct ReplayResult {
  int world_size = 0;
  // The replayed job's layout: tp positions (an expert-parallel job's ep x
  // tensor-parallel ranks of a replica: op_trace.proto's TraceLayout), pp,
  // dp replicas, and ep (1 without expert parallelism).
  int tp = 1, pp = 1, dp = 1, ep = 1;
  int recorded_world_size = 0;
  std::vector<ReplayedStep> steps;
};

// InvalidUsage names what cannot be replayed: traces that do not form one
// job (ranks missing or repeated, layouts differing), a target world that
// tp x pp does not divide, a group that spans part of the data-parallel
// axis or a message between replicas when the data-parallel size changes,
// or traces whose operations never match (a deadlock, naming the ranks and
// what they wait for).
ReplayResult ReplayTraces(const std::vector<proto::RankTrace>& traces,
                          const FabricModel& target);

// Every rank_N.pb in `dir` (OpTrace::Save), ordered by rank.
std::vector<proto::RankTrace> LoadJobTraces(const std::string& dir);

}  // namespace neuron::runtime
