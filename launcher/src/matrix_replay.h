// Modelled figures for the scaling matrix and `neuronrun replay`: a job's
// recorded operation traces (runtime/fabric/trace_replay.h) replayed on a
// layout of nodes x ranks per node on a topology.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "neuron/runtime/op_trace.pb.h"

namespace neuron::launcher {

struct ReplayLayout {
  int nodes = 1;
  int ranks_per_node = 1;
  std::string topology;  // a file, or "" for the embedded trn2 node
};

// The figures `neuronrun matrix` reports for a cell (key -> value):
// modelled_step_us, compute_us, exposed_comm_us, bubble_us (the slowest
// rank's, medians over the steps after the first), modelled tokens/s in
// all and per device (`tokens_per_rank_step` tokens per data-parallel rank
// per step), bytes_per_step_KIND (rank 0's collectives), world, tp, pp, dp,
// steps and recorded_world. InvalidUsage or IoError say why the traces in
// `traces` (a job's, runtime::LoadJobTraces) cannot be replayed there.
std::map<std::string, std::string> ReplayFigures(
    const std::vector<runtime::proto::RankTrace>& traces, const ReplayLayout& layout,
    double tokens_per_rank_step);

}  // namespace neuron::launcher
