// Traces of a job at another tensor-parallel size, made from two recordings
// of the same job at two tensor-parallel sizes (docs/scaling.md, "Modelled
// cells"): what lets `neuronrun replay` and the scaling matrix model a tp
// that no job small enough to run here could record.
//
// The two recordings, at tp = a and tp = b (a != b, the same pp, the same
// model and per-replica batch), run the same program: op i of rank
// (t, d, p) in one is op i of rank (t mod b, d mod dp_b, p) in the other,
// with the same kinds, marks, waits and group shapes. Each figure of the
// new job is the recordings' figure on Amdahl's law, v(tp) = s + q / tp
// through the two points (clamped at 0): compute charges (the sharded
// matmuls shrink, the replicated norms do not) and collective and message
// sizes (a data-parallel gradient all-reduce carries the tp-sharded
// weights' 1/tp and the replicated ones' whole; a tensor-parallel
// all-reduce of activations is the same at every tp). A group that spans
// the tensor-parallel axis spans the new one; one that holds a single
// tensor position holds the rank's own; the pipeline and data-parallel
// coordinates are the recording's. The new job keeps the data-parallel
// size of the recording with more replicas (ReplayTraces then scales it).
//
// Usage:
//   auto traces = ScaleTensorParallel(LoadJobTraces("tp2"), LoadJobTraces("tp4"), 16);
//   ReplayResult r = ReplayTraces(traces, model);   // a tp=16 job
#pragma once

#include <vector>

#include "neuron/runtime/op_trace.pb.h"

namespace neuron::runtime {

// The target tp is at least the smaller recorded one: a smaller tp holds
// more gradient bytes per rank, and a byte-capped bucketing (DDP's) may
// split them into more collectives than either recording has; up from
// there the bucket count can only stay or fall, and two recordings with
// the same count bound it.
//
// InvalidUsage names what cannot be scaled: traces that are not a job
// (CheckJobTraces), tp < 1 or below both recordings, equal recorded tp
// sizes, different pp sizes,
// the first rank and op where the two programs differ, a group spanning
// part of the tensor-parallel axis, or a message between tensor positions.
std::vector<proto::RankTrace> ScaleTensorParallel(const std::vector<proto::RankTrace>& a,
                                                  const std::vector<proto::RankTrace>& b,
                                                  int tp);

}  // namespace neuron::runtime
