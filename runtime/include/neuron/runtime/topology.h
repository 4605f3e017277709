// Loading and validating the fabric topology a job runs on.
//
// Usage:
//   Topology topo = Topology::FromFile("configs/topologies/trn2-node.textproto");
//   Topology dflt = Topology::Default();            // embedded trn2 node
//   Topology mine = Topology::FromEnvironment();    // NEURON_TOPOLOGY_FILE
//   topo.CheckFits(/*num_nodes=*/2, /*ranks_per_node=*/{16, 16});
//   ChipPlacement p = topo.Place(/*node=*/1, /*local_rank=*/3);
//
// Every error names the file and, for parse errors, the line and column.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "neuron/runtime/sim_time.h"
#include "neuron/runtime/topology.pb.h"

namespace neuron::runtime {

// Where one rank sits on the simulated fabric.
struct ChipPlacement {
  std::uint32_t node = 0;
  std::uint32_t chip = 0;  // global chip index: node * chips_per_node + local
  std::uint32_t core = 0;  // rank slot within the chip
};

// True when one switch joins every node's chips (intra_node SWITCH with
// inter_node NEURONLINK: a Trn3 UltraServer's scale-up domain).
bool SharedSwitch(const proto::TopologySpec& spec);

class Topology {
 public:
  // The embedded default: one trn2 node (configs/topologies/trn2-node.textproto).
  static Topology Default();
  // Parses and validates a text-format TopologySpec; throws InvalidUsage
  // naming the file (and line/column) on any problem.
  static Topology FromFile(const std::string& path);
  // Parses text; `origin` names where it came from in error messages.
  static Topology FromText(const std::string& text, const std::string& origin);
  // The file named by NEURON_TOPOLOGY_FILE, or Default() when unset, with
  // the faults and rank delays of NEURON_FAULTS added.
  static Topology FromEnvironment();
  // `topology` with the faults and rank delays of NEURON_FAULTS added.
  static Topology WithEnvironmentFaults(Topology topology);
  // How much later `rank` reaches every collective (rank_delays).
  SimDuration RankDelay(int rank) const;

  const proto::TopologySpec& spec() const { return spec_; }
  // Physical NeuronCores per chip: cores_per_chip, or Trainium2's 8 when 0.
  std::uint32_t CoresPerChip() const;
  const std::string& origin() const { return origin_; }

  // Throws InvalidUsage when a job of this shape cannot be placed: more nodes
  // than the topology has, or more ranks on a node than chips x ranks_per_chip.
  void CheckFits(std::uint32_t num_nodes,
                 const std::vector<std::uint32_t>& ranks_per_node) const;
  // Ranks fill a node's chips in order, ranks_per_chip to a chip.
  ChipPlacement Place(std::uint32_t node, std::uint32_t local_rank) const;

 private:
  Topology(proto::TopologySpec spec, std::string origin);
  void Validate() const;

  proto::TopologySpec spec_;
  std::string origin_;
};

}  // namespace neuron::runtime
