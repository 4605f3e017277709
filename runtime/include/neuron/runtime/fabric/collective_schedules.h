// The transfer schedules of Neuron's collective algorithms, for the fabric
// model: what the hardware would do, independent of how the host moved the
// real bytes. Sizes follow nccl-tests: `bytes` is the per-rank buffer for
// allreduce, broadcast and reduce, the total (gathered) size for allgather
// and reduce-scatter, and the per-rank send total for all-to-all.
//
// Algorithms (../shared/REFERENCE.md, "collectives on Neuron"):
//   ring          reduce-scatter + allgather around a ring (Patarasuk & Yuan 2009)
//   mesh          every rank sends its share to every other in one step
//   rdh           recursive halving reduce-scatter + doubling allgather over
//                 the torus treated as a hypercube (Rabenseifner 2004)
//   recursive_doubling  log2(n) full-size exchanges (Thakur et al. 2005)
//   hierarchical  one ring stage per level of the fabric the group spans
//                 (HierarchyLevels: on-chip, each torus dimension, nodes):
//                 reduce-scatter inner levels first, allgather outer levels
//                 first, allreduce the one then the other; pipelined in
//                 the chunk count the model rates fastest within the
//                 topology's collective_engine bounds
//   tree          binomial tree (broadcast, reduce)
// A ring allreduce, allgather, reduce-scatter or all-to-all that spans nodes
// runs the topology's inter_node_ring_channels channels (at most the fewest
// ranks a node has in it): rings rotated within each node so that each
// leaves every node from another rank, each carrying its share of the
// buffer.
// Ring also runs all-to-all (store and forward: step k carries the n - k
// shares still k or more hops from their destination; each share crosses
// as many links as it is hops away) and broadcast / reduce (a chain from
// the root).
// Reduce-scatter steps mark their transfers `reduce` (FabricModel prices
// the reduction).
//
// Usage:
//   CollectiveShape shape{CollectiveKind::kAllReduce, 64 << 20, AllRanks(16)};
//   Schedule s = BuildSchedule(model, shape, ChooseAlgorithm(model, shape));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "neuron/runtime/fabric/collective_names.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/fabric/schedule.h"

namespace neuron::runtime {

struct CollectiveShape {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double bytes = 0;
  std::vector<int> ranks;  // global ranks taking part, in communicator order
  int root = 0;            // index into `ranks` (broadcast, reduce)
};

// {0, 1, ..., n-1}.
std::vector<int> AllRanks(int n);

// NEURON_FABRIC_ALGO (kAuto when unset); InvalidUsage names a bad value.
FabricAlgorithm ConfiguredFabricAlgorithm();

// Whether `algorithm` runs this shape: ring every kind; mesh allreduce,
// allgather, reduce-scatter and all-to-all; rdh allreduce, allgather and
// reduce-scatter on a power-of-two group; recursive_doubling allreduce on a
// power-of-two group; hierarchical allreduce, allgather and reduce-scatter
// with the same ranks on every node; tree broadcast and reduce; auto all.
bool Implements(const FabricModel& model, FabricAlgorithm algorithm,
                const CollectiveShape& shape);

// The automatic choice: Neuron's own where the topology's calibration has
// a rule for this kind, size and span whose algorithm runs the shape (the
// first such); otherwise the one the model rates fastest among Neuron's
// documented algorithms that run the shape (ring, mesh, rdh; hierarchical
// when the group spans nodes; tree), the first listed on a tie.
FabricAlgorithm ChooseAlgorithm(const FabricModel& model, const CollectiveShape& shape);

// ChooseAlgorithm's choice with its schedule and modelled time (what the
// choice computed: no second build).
struct ChosenSchedule {
  FabricAlgorithm algorithm = FabricAlgorithm::kRing;
  Schedule schedule;
  double micros = 0;
};
ChosenSchedule AutomaticSchedule(const FabricModel& model, const CollectiveShape& shape);

// kAuto builds ChooseAlgorithm's. Throws InvalidUsage when the algorithm
// cannot run this shape (Implements).
Schedule BuildSchedule(const FabricModel& model, const CollectiveShape& shape,
                       FabricAlgorithm algorithm);

// The participants in ring order: by node, then by the chip's position on a
// snake through the node's torus (so consecutive chips are neighbours and
// the ring closes over a wrap-around link), then by core.
std::vector<int> RingOrder(const FabricModel& model, const std::vector<int>& ranks);

// nccl-tests bus bandwidth factor: allreduce 2(n-1)/n; allgather,
// reduce-scatter, all-to-all (n-1)/n; broadcast, reduce 1.
double BusBandwidthFactor(CollectiveKind kind, int n);

}  // namespace neuron::runtime
