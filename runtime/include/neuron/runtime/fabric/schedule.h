// A collective as the hardware would run it: steps of concurrent transfers
// between ranks, grouped into stages.
//
// Steps are bulk-synchronous: a step ends when its slowest transfer does and
// the next step of the same stage starts then. A stage is a phase on one set
// of links (an intra-node reduce-scatter, an inter-node allreduce, ...). With
// `chunks` > 1 the buffer moves in that many equal chunks, and the stages
// form a pipeline: stage s works on chunk c once stage s-1 has finished it,
// while stage s-1 moves on to chunk c+1 (FabricModel::Simulate gives the
// exact rule). A schedule without stages is one stage of all its steps.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "neuron/runtime/fabric/collective_names.h"

namespace neuron::runtime {

struct Transfer {
  int src = 0;  // rank
  int dst = 0;  // rank
  double bytes = 0;
  // The receiver reduces what arrives into its buffer (a reduce-scatter
  // step) rather than storing it: costs reduction compute at `dst`.
  bool reduce = false;
};

struct Step {
  std::vector<Transfer> transfers;
};

struct Stage {
  std::string name;  // e.g. "reduce-scatter over torus dim 1"
  std::size_t first_step = 0;
  std::size_t end_step = 0;  // one past the last
};

struct Schedule {
  Schedule() = default;
  // A schedule of `steps` in one stage, for no collective (tests, messages).
  Schedule(const char* algorithm_name, std::vector<Step> schedule_steps)
      : algorithm(algorithm_name), steps(std::move(schedule_steps)) {}

  // "ring", "mesh", "rdh", "recursive_doubling", ...: a string literal (it
  // lives as long as the process, so costs and records hold it as is).
  const char* algorithm = "";
  std::vector<Step> steps;
  // Empty: one stage of every step. Otherwise they cover `steps` in order.
  std::vector<Stage> stages;
  // Equal chunks the buffer is pipelined in (1: the whole buffer at once).
  int chunks = 1;
  // The collective it runs, which with `algorithm` says which of the
  // topology's calibrated costs it pays; none (point-to-point, a linear
  // gather or scatter) pays none of them.
  std::optional<CollectiveKind> kind;
  // A rank's sends in a step go one after another (mesh: one channel), so
  // a step's calibrated cost counts once per peer rather than once.
  bool serial_sends = false;
};

// One message of `bytes` from rank `src` to rank `dst` ("p2p"): no
// collective, so it pays the wire and the DMA rate only.
inline Schedule PointToPointSchedule(int src, int dst, double bytes) {
  return Schedule("p2p", {Step{{Transfer{src, dst, bytes, false}}}});
}

}  // namespace neuron::runtime
