// The fabric as a directed graph of links between chips, from a Topology:
// inside each node torus links (NeuronLink) or each chip's port into the
// node's NeuronSwitch (intra_node SWITCH), and between nodes either EFA
// (each chip's NIC into a non-blocking switch) or the UltraServer's
// NeuronLink ring joining same-coordinate chips (a torus node), or one
// NeuronSwitch for every node's chips (a switch node). Faults from the
// topology slow links down or take them out. The links are formulas
// (FabricLinks): the graph stores no link per chip.
//
// Usage:
//   FabricGraph graph(Topology::Default(), /*num_nodes=*/2);
//   for (int link : graph.Route(0, 17)) std::cout << graph.link(link).name;
//
// Routes are least-latency paths (ties: fewer hops, then the lower vertex
// id first reached). The first route from a chip computes that chip's
// shortest-path tree, once, thread-safely; later ones walk it. Where every
// route between nodes passes a hub (the EFA switch, a shared NeuronSwitch)
// a tree holds the source's node, the hubs and one node without faults,
// whose branch stands for every such node (a node with faults gets a tree
// of its own): about 2 x chips_per_node entries a source chip. On an
// UltraServer ring a tree holds every vertex. So memory grows with the
// chips a model routes from, not with the topology's chips.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "neuron/runtime/fabric/fabric_links.h"
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

  int num_chips() const { return links_.num_chips(); }
  int chips_per_node() const { return links_.chips_per_node(); }
  int num_links() const { return links_.num_links(); }  // ids are 0 .. num_links() - 1
  Link link(int id) const;
  // What the model's hot path reads of link `id` (no name).
  Hop hop(int id) const { return links_.At(id); }

  // Link ids from chip `from` to chip `to` (empty when equal). Throws
  // InvalidUsage naming the down links when faults leave no route.
  std::vector<int> Route(int from, int to) const;
  // Calls `f(link id)` for every link of that route, the last hop first
  // (no allocation once the tree is made); the same errors.
  template <typename F>
  void ForEachLink(int from, int to, F f) const {
    if (from == to) return;
    const View view = Reaching(from, to);
    for (int v = view.target; v != from;) {
      const int id = view.tree->via[static_cast<std::size_t>(view.tree->Index(v, links_))];
      const bool moved = view.shift != 0 && links_.NodeOf(v) == view.tree->remote_node;
      f(moved ? links_.Shifted(id, view.shift) : id);
      v = links_.From(id);
    }
  }

  // Route-tree entries held (one int each): what the routes made so far
  // cost, for tests and measurements.
  std::size_t route_entries() const;

 private:
  // A shortest-path tree from one chip over the vertices it holds.
  struct Tree {
    int source_node = 0;
    int remote_node = -1;   // the other node whose chips it holds (-1: none)
    bool all = false;       // it holds every vertex
    std::vector<int> hubs;  // hub vertices held, ascending
    std::vector<int> via;   // per vertex held: the link into it (-1: none, or the source)
    // Position of vertex `v` in `via`, -1 when not held.
    int Index(int v, const FabricLinks& links) const;
  };
  // A tree reaching `target` (`to`, or its twin in the tree's remote node,
  // `shift` nodes before `to`'s).
  struct View {
    const Tree* tree = nullptr;
    int target = 0;
    int shift = 0;
  };
  View Reaching(int from, int to) const;
  const Tree& TreeFor(int from, int remote) const;
  Tree MakeTree(int from, int remote) const;
  // The fault-free node other than `node` whose branch stands for all of them.
  int TemplateNode(int node) const;

  FabricLinks links_;
  std::uint64_t serial_;  // this graph's, among every graph the process made
  mutable std::mutex mutex_;
  // (chip << 32 | remote + 1) -> its tree
  mutable std::unordered_map<std::uint64_t, std::unique_ptr<Tree>> trees_;
};

// Throws InvalidUsage, naming the chips and the links down, unless every
// chip that holds a rank of a job of `num_nodes` nodes with these ranks per
// node can reach every other over the fabric (faults can cut them apart):
// the launchers check it before starting ranks.
void CheckRoutes(const Topology& topology, std::uint32_t num_nodes,
                 const std::vector<std::uint32_t>& ranks_per_node);

}  // namespace neuron::runtime
