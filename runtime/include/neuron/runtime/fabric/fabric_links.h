// The fabric's links by formula: what FabricGraph routes over, without a
// stored link per chip. A link's id, ends, figures and name follow from its
// index and the topology's node shape and tier sizes, so a topology of a
// million chips costs what one node does; only the faults are stored.
//
// Vertices: the chips 0 .. num_chips - 1, then the EFA switch (when the job
// has nodes joined by EFA), then the NeuronSwitches (one per node with
// intra_node SWITCH, or one for every node's chips when shared).
//
// Link ids, in this order (the order a graph of stored links would add
// them, so ids and the fault messages' order do not depend on storage):
//   intra-node: per chip, its torus links (each dimension of more than one
//     chip, +1 then -1, one link in a dimension of two), or its two switch
//     ports (out, in);
//   between nodes: EFA, per chip its NIC (out, in); or the UltraServer ring
//     joining same-coordinate chips, per node, per direction (+1, -1; one
//     between two nodes), per chip.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "neuron/runtime/sim_time.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

// A link's ends and figures (no name: what routing reads).
struct Hop {
  int from = 0;
  int to = 0;
  double bytes_per_second = 0;  // after any slowdown fault
  SimDuration latency{0};
  bool down = false;
};

class FabricLinks {
 public:
  // `job_nodes` is used when the topology leaves num_nodes at 0.
  FabricLinks(const Topology& topology, std::uint32_t job_nodes);

  int num_chips() const { return num_chips_; }
  int chips_per_node() const { return chips_per_node_; }
  int num_nodes() const { return num_nodes_; }
  int num_vertices() const { return num_vertices_; }
  // Ids are 0 .. num_links() - 1.
  int num_links() const { return intra_links_ + inter_links_; }
  int efa_switch() const { return efa_switch_; }  // -1: none
  // The NeuronSwitch vertex `node`'s chips use (-1: no switch).
  int NodeSwitch(int node) const;
  // The node a chip or a node's own NeuronSwitch belongs to; -1 for the EFA
  // switch and a switch shared by every node.
  int NodeOf(int vertex) const;
  // True when every route between two nodes passes the EFA switch or a
  // shared NeuronSwitch (no chip of a third node is ever on it).
  bool RoutesThroughHub() const { return hub_; }

  Hop At(int id) const;
  int From(int id) const { return Plain(id).from; }
  std::string Name(int id) const;  // "chip 3 -> chip 7", "chip 3 NIC out", ...
  // Calls f(id) for each link leaving chip `chip`, in id order.
  template <typename F>
  void ForEachFromChip(int chip, F f) const {
    const int node = chip / chips_per_node_, local = chip % chips_per_node_;
    // A chip's torus links, or its switch port out (its port in leads to it).
    const int intra = dims_.empty() ? 1 : intra_per_chip_;
    for (int slot = 0; slot < intra; ++slot) f(chip * intra_per_chip_ + slot);
    if (efa_switch_ >= 0) f(intra_links_ + 2 * chip);
    for (int s = 0; s < ring_directions_; ++s) {
      f(intra_links_ + (node * ring_directions_ + s) * chips_per_node_ + local);
    }
  }
  // The link from hub vertex `hub` (EFA switch or NeuronSwitch) to `chip`,
  // -1 when they are not linked.
  int HubToChip(int hub, int chip) const;
  // The link `nodes` nodes further on (a per-chip link: intra-node or a NIC).
  int Shifted(int id, int nodes) const;

  // Faults: nodes whose chips a fault touches, and the links down by name.
  bool Faulty(int node) const { return faulty_nodes_.count(node) > 0; }
  const std::set<int>& faulty_nodes() const { return faulty_nodes_; }
  const std::string& down_links() const { return down_links_; }

 private:
  Hop Plain(int id) const;  // before faults
  void ApplyFaults(const proto::TopologySpec& spec);
  std::vector<int> FaultedLinks(const proto::LinkFault& fault) const;
  std::vector<int> LinksBetween(int from, int to) const;

  proto::LinkSpec intra_, inter_;
  std::vector<int> dims_;                      // torus dims (empty: switch)
  std::vector<std::pair<int, int>> torus_slots_;  // (dimension, +1 or -1) per slot
  std::vector<int> torus_next_;  // [local chip x slot]: the local chip that slot reaches
  int num_chips_ = 0, chips_per_node_ = 0, num_nodes_ = 0, num_vertices_ = 0;
  int intra_per_chip_ = 0;   // torus slots, or 2 switch ports
  int intra_links_ = 0, inter_links_ = 0;
  int ring_directions_ = 0;  // 0 without an UltraServer ring, else 1 or 2
  int efa_switch_ = -1, first_switch_ = -1;
  bool shared_switch_ = false, hub_ = false;
  std::map<int, std::pair<double, bool>> faulted_;  // id -> (bytes/s, down)
  std::set<int> faulty_nodes_;
  std::string down_links_;
};

// Coordinates of a node's chip `local_chip` in a torus of `dims` (the first
// dimension varies slowest), as the links wire it.
std::vector<int> TorusCoordinates(int local_chip, const std::vector<int>& dims);

}  // namespace neuron::runtime
