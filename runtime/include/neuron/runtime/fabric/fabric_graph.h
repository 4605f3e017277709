// The fabric as a directed graph of links between chips, built from a
// Topology: inside each node torus links (NeuronLink) or each chip's port
// into the node's NeuronSwitch (intra_node SWITCH), and between nodes
// either EFA (each chip's NIC into a non-blocking switch) or the
// UltraServer's NeuronLink ring joining same-coordinate chips (a torus
// node), or one NeuronSwitch for every node's chips (a switch node). Faults
// from the topology slow links down or take them out.
//
// Usage:
//   FabricGraph graph(Topology::Default(), /*num_nodes=*/2);
//   for (int link : graph.Route(0, 17)) std::cout << graph.link(link).name;
//
// Routes are least-latency paths (ties: fewer hops). The first route from a
// chip computes that chip's shortest-path tree (one int per vertex), once,
// thread-safely; later ones walk it. So a model's memory and set-up grow
// with the chips it routes from, not with the square of the topology's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "neuron/runtime/sim_time.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {

struct Link {
  int from = 0;               // vertex: a chip, the EFA switch or a NeuronSwitch
  int to = 0;
  double bytes_per_second = 0;  // after any slowdown fault
  SimDuration latency{0};
  std::string name;           // "chip 3 -> chip 7", "chip 3 NIC out", ...
  bool down = false;
};

class FabricGraph {
 public:
  // `job_nodes` is used when the topology leaves num_nodes at 0.
  FabricGraph(const Topology& topology, std::uint32_t job_nodes);

  int num_chips() const { return num_chips_; }
  int chips_per_node() const { return chips_per_node_; }
  const Link& link(int id) const { return links_[id]; }
  const std::vector<Link>& links() const { return links_; }

  // Link ids from chip `from` to chip `to` (empty when equal). Throws
  // InvalidUsage naming the down links when faults leave no route.
  std::vector<int> Route(int from, int to) const;
  // Calls `f(link id)` for every link of that route, the last hop first
  // (no allocation: what the model's hot path uses); the same errors.
  template <typename F>
  void ForEachLink(int from, int to, F f) const {
    if (from == to) return;
    const std::vector<int>& via = TreeReaching(from, to);
    for (int v = to; v != from; v = links_[via[v]].from) f(via[v]);
  }

 private:
  int AddLink(int from, int to, const proto::LinkSpec& spec, std::string name);
  void AddTorusLinks(const proto::TopologySpec& spec, int node);
  // Chips first_chip .. first_chip + chips - 1, each linked both ways to
  // the switch vertex `sw` by a port of intra_node_link's figures.
  void AddSwitchPorts(const proto::TopologySpec& spec, int first_chip, int chips, int sw);
  void AddInterNodeLinks(const proto::TopologySpec& spec, int nodes);
  void ApplyFaults(const proto::TopologySpec& spec);
  // The shortest-path tree from chip `src`: per vertex, the link into it
  // (-1: none, or `src` itself). Made on first use.
  const std::vector<int>& TreeFrom(int src) const;
  // TreeFrom(from), after checking both chips exist and `to` is reached.
  const std::vector<int>& TreeReaching(int from, int to) const;

  int num_chips_ = 0;
  int chips_per_node_ = 0;
  int num_vertices_ = 0;
  int efa_switch_ = -1;  // the EFA switch's vertex, -1 when the job has none
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_links_;       // per vertex
  mutable std::vector<std::vector<int>> trees_;  // [src], see TreeFrom
  std::unique_ptr<std::once_flag[]> tree_made_;
  std::string down_links_;                          // for error messages
};

// Coordinates of a node's chip `local_chip` in a torus of `dims` (the first
// dimension varies slowest), as the graph wires it.
std::vector<int> TorusCoordinates(int local_chip, const std::vector<int>& dims);

// Throws InvalidUsage, naming the chips and the links down, unless every
// chip that holds a rank of a job of `num_nodes` nodes with these ranks per
// node can reach every other over the fabric (faults can cut them apart):
// the launchers check it before starting ranks.
void CheckRoutes(const Topology& topology, std::uint32_t num_nodes,
                 const std::vector<std::uint32_t>& ranks_per_node);

}  // namespace neuron::runtime
