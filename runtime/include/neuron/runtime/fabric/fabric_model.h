// How long a schedule of transfers takes on the simulated fabric.
//
// Each transfer follows its route (FabricGraph). Within a step, transfers
// that share a link share its bandwidth equally; a transfer moves at the
// rate of its most contended link and pays the latency of every hop:
//   time = sum(hop latency) + bytes / min over links (bandwidth / sharers).
// Ranks on the same chip exchange through the on-chip link (HBM DMA).
//
// Usage:
//   FabricModel model(Topology::Default(), PlaceRanks(topology, {16}));
//   SimDuration t = model.Simulate(RingAllReduce(order, bytes)).total;
#pragma once

#include <cstdint>
#include <vector>

#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/schedule.h"
#include "neuron/runtime/sim_time.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

struct SimulationResult {
  SimDuration total{0};
  std::vector<SimDuration> steps;
  double link_bytes = 0;  // bytes x hops summed over transfers
};

class FabricModel {
 public:
  // `placement[r]` is where rank r sits (Topology::Place).
  FabricModel(const Topology& topology, std::vector<ChipPlacement> placement);

  SimulationResult Simulate(const Schedule& schedule) const;

  const FabricGraph& graph() const { return graph_; }
  const std::vector<ChipPlacement>& placement() const { return placement_; }
  const Topology& topology() const { return topology_; }
  int world_size() const { return static_cast<int>(placement_.size()); }
  int num_nodes() const { return num_nodes_; }

 private:
  SimDuration StepTime(const Step& step, double* link_bytes) const;

  Topology topology_;
  std::vector<ChipPlacement> placement_;
  int num_nodes_;
  FabricGraph graph_;
};

// Places `ranks_per_node[i]` ranks on node i, in rank order (as neuronrun does).
std::vector<ChipPlacement> PlaceRanks(const Topology& topology,
                                      const std::vector<std::uint32_t>& ranks_per_node);

}  // namespace neuron::runtime
