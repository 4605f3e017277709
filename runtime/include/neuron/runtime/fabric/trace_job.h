// A job's operation traces as the replay and the tensor-parallel scaling
// read them: the recorded mesh, and the checks every trace passes before
// either follows it (a trace is a file, and a file may have been damaged or
// made by hand). The pipeline scaling (parallel/pipeline_trace_scaling.h)
// reads them too.
#pragma once

#include <vector>

#include "neuron/runtime/op_trace.pb.h"

namespace neuron::runtime {

// parallel::MeshLayout's numbering (op_trace.proto, TraceLayout).
struct Mesh {
  int tp, pp, dp;
  int world() const { return tp * pp * dp; }
  int Rank(int t, int p, int d) const { return p * (dp * tp) + d * tp + t; }
  int Tensor(int rank) const { return rank % tp; }
  int Data(int rank) const { return (rank / tp) % dp; }
  int Pipeline(int rank) const { return rank / (tp * dp); }
};

// The traces' mesh. InvalidUsage names what is wrong: traces that do not
// form one job (ranks missing, repeated or out of order, layouts or worlds
// differing, a layout that is not the world), or a figure or index of an
// op the replay cannot follow (a group member outside the job or listed
// twice, a group without the rank itself, a root outside its group, a
// non-finite or negative time or size, an unknown collective), naming the
// rank and the op.
Mesh CheckJobTraces(const std::vector<proto::RankTrace>& traces);

}  // namespace neuron::runtime
