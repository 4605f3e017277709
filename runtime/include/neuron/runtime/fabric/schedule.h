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
  // The step runs this many times in a row, the same transfers each time
  // (a ring's n - 1 steps): one entry, so a schedule holds O(ranks)
  // transfers, not O(ranks^2), and the model prices the step once.
  std::size_t repeat = 1;
  // Besides `transfers`, a mesh: every rank of `mesh` sends `mesh_bytes` to
  // every other, in the order `for a in mesh: for b in mesh: if a != b`
  // (ForEachTransfer), stored as its ranks: O(ranks), not the O(ranks^2)
  // transfers it stands for.
  std::vector<int> mesh = {};
  double mesh_bytes = 0;
  bool mesh_reduce = false;
};

// Calls f(const Transfer&) for every transfer of `step`: `transfers`, then
// the mesh's.
template <typename F>
void ForEachTransfer(const Step& step, F f) {
  for (const Transfer& t : step.transfers) f(t);
  for (int a : step.mesh) {
    for (int b : step.mesh) {
      if (a != b) f(Transfer{a, b, step.mesh_bytes, step.mesh_reduce});
    }
  }
}

// True when `step` has no transfer.
inline bool Empty(const Step& step) {
  for (int r : step.mesh) {
    if (r != step.mesh.front()) return false;
  }
  return step.transfers.empty();
}

struct Stage {
  std::string name;  // e.g. "reduce-scatter over torus dim 1"
  std::size_t first_step = 0;  // entries of Schedule::steps
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

// The steps `schedule` runs: its entries' repeats added up.
inline std::size_t StepCount(const Schedule& schedule) {
  std::size_t n = 0;
  for (const Step& step : schedule.steps) n += step.repeat;
  return n;
}

// One message of `bytes` from rank `src` to rank `dst` ("p2p"): no
// collective, so it pays the wire and the DMA rate only.
inline Schedule PointToPointSchedule(int src, int dst, double bytes) {
  return Schedule("p2p", {Step{{Transfer{src, dst, bytes, false}}}});
}

}  // namespace neuron::runtime
