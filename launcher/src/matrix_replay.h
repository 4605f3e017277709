// Modelled figures for the scaling matrix and `neuronrun replay`: a job's
// recorded operation traces (runtime/fabric/trace_replay.h) replayed on a
// layout of nodes x ranks per node on a topology.
#pragma once

#include <string>
#include <vector>

#include "neuron/launcher/matrix_result.pb.h"
#include "neuron/runtime/op_trace.pb.h"

namespace neuron::launcher {

struct ReplayLayout {
  int nodes = 1;
  int ranks_per_node = 1;
  std::string topology;  // a file, or "" for the embedded trn2 node
};

// The modelled figures of a cell replayed from `traces` (a job's,
// runtime::LoadJobTraces): modelled step, compute, exposed communication
// and bubble (the slowest rank's, medians over the steps after the first),
// modelled tokens/s in all and per device (`tokens_per_rank_step` tokens
// per data-parallel rank per step; an expert-parallel trace's ep ranks of
// a replica are data-parallel ranks too), rank 0's collective bytes per
// step, world, tp, pp, dp, steps and recorded_world; no loss, wall time or
// memory. InvalidUsage or IoError say why the traces cannot be replayed
// there.
proto::RunFigures ReplayFigures(
    const std::vector<runtime::proto::RankTrace>& traces, const ReplayLayout& layout,
    double tokens_per_rank_step);

}  // namespace neuron::launcher
