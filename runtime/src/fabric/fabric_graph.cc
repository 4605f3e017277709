#include "neuron/runtime/fabric/fabric_graph.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <tuple>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {

std::string ChipName(int chip) { return "chip " + std::to_string(chip); }

int Index(const std::vector<int>& coords, const std::vector<int>& dims) {
  int index = 0;
  for (std::size_t d = 0; d < dims.size(); ++d) index = index * dims[d] + coords[d];
  return index;
}

}  // namespace

std::vector<int> TorusCoordinates(int local_chip, const std::vector<int>& dims) {
  std::vector<int> coords(dims.size());
  for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d) {
    coords[d] = local_chip % dims[d];
    local_chip /= dims[d];
  }
  return coords;
}

FabricGraph::FabricGraph(const Topology& topology, std::uint32_t job_nodes) {
  const auto& spec = topology.spec();
  const int nodes = static_cast<int>(spec.num_nodes() != 0 ? spec.num_nodes()
                                                           : std::max<std::uint32_t>(job_nodes, 1));
  chips_per_node_ = static_cast<int>(spec.chips_per_node());
  num_chips_ = nodes * chips_per_node_;
  const bool efa_switch = nodes > 1 && spec.inter_node() == proto::TopologySpec::EFA;
  const bool node_switches = spec.intra_node() == proto::TopologySpec::SWITCH;
  const bool shared = SharedSwitch(spec);
  // Vertices: the chips, the EFA switch (index num_chips_), then the
  // NeuronSwitches (one per node, or one for all when shared).
  efa_switch_ = efa_switch ? num_chips_ : -1;
  const int first_switch = num_chips_ + (efa_switch ? 1 : 0);
  num_vertices_ = first_switch + (node_switches ? (shared ? 1 : nodes) : 0);
  out_links_.resize(num_vertices_);
  for (int node = 0; node < nodes; ++node) {
    if (!node_switches) {
      AddTorusLinks(spec, node);
    } else if (!shared) {
      AddSwitchPorts(spec, node * chips_per_node_, chips_per_node_, first_switch + node);
    }
  }
  if (shared) AddSwitchPorts(spec, 0, num_chips_, first_switch);
  if (nodes > 1 && !shared) AddInterNodeLinks(spec, nodes);
  ApplyFaults(spec);
  trees_.resize(num_chips_);
  tree_made_ = std::make_unique<std::once_flag[]>(num_chips_);
}

int FabricGraph::AddLink(int from, int to, const proto::LinkSpec& spec, std::string name) {
  Link link;
  link.from = from;
  link.to = to;
  link.bytes_per_second = spec.bandwidth_gbps() * 1e9;
  link.latency = SimDuration(spec.latency_us());
  link.name = std::move(name);
  links_.push_back(link);
  out_links_[from].push_back(static_cast<int>(links_.size()) - 1);
  return static_cast<int>(links_.size()) - 1;
}

void FabricGraph::AddTorusLinks(const proto::TopologySpec& spec, int node) {
  const std::vector<int> dims(spec.torus_dims().begin(), spec.torus_dims().end());
  const int base = node * chips_per_node_;
  for (int c = 0; c < chips_per_node_; ++c) {
    const auto coords = TorusCoordinates(c, dims);
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == 1) continue;
      // +1 and -1 neighbours; in a dimension of 2 they are the same chip.
      for (int step : {+1, -1}) {
        if (dims[d] == 2 && step == -1) continue;
        auto n = coords;
        n[d] = (n[d] + step + dims[d]) % dims[d];
        const int neighbour = base + Index(n, dims);
        AddLink(base + c, neighbour, spec.intra_node_link(),
                ChipName(base + c) + " -> " + ChipName(neighbour));
      }
    }
  }
}

void FabricGraph::AddSwitchPorts(const proto::TopologySpec& spec, int first_chip, int chips,
                                 int sw) {
  // As the EFA NICs: the way in to the switch carries the hop latency, the
  // switch does not block, the way out only limits bandwidth.
  proto::LinkSpec out = spec.intra_node_link();
  out.set_latency_us(0);
  for (int chip = first_chip; chip < first_chip + chips; ++chip) {
    AddLink(chip, sw, spec.intra_node_link(), ChipName(chip) + " switch port out");
    AddLink(sw, chip, out, ChipName(chip) + " switch port in");
  }
}

void FabricGraph::AddInterNodeLinks(const proto::TopologySpec& spec, int nodes) {
  if (spec.inter_node() == proto::TopologySpec::EFA) {
    // Each chip's NIC: egress carries the hop latency, the switch does not
    // block, ingress only limits bandwidth.
    const int sw = num_chips_;
    proto::LinkSpec ingress = spec.inter_node_link();
    ingress.set_latency_us(0);
    for (int chip = 0; chip < num_chips_; ++chip) {
      AddLink(chip, sw, spec.inter_node_link(), ChipName(chip) + " NIC out");
      AddLink(sw, chip, ingress, ChipName(chip) + " NIC in");
    }
    return;
  }
  // UltraServer: same-coordinate chips of consecutive nodes form a ring.
  for (int node = 0; node < nodes; ++node) {
    for (int step : {+1, -1}) {
      if (nodes == 2 && step == -1) continue;
      const int other = (node + step + nodes) % nodes;
      for (int c = 0; c < chips_per_node_; ++c) {
        const int a = node * chips_per_node_ + c, b = other * chips_per_node_ + c;
        AddLink(a, b, spec.inter_node_link(), ChipName(a) + " -> " + ChipName(b));
      }
    }
  }
}

void FabricGraph::ApplyFaults(const proto::TopologySpec& spec) {
  for (const auto& fault : spec.faults()) {
    const int a = fault.from_chip();
    const int b = fault.to_chip();
    bool found = false;
    for (auto& link : links_) {
      const bool one_way = fault.one_way();
      const int sw = efa_switch_;  // -1 (no vertex) without EFA between nodes
      const bool nic = sw >= 0 && b == -1 && link.to == sw && link.from == a;
      const bool nic_in = sw >= 0 && ((!one_way && b == -1 && link.from == sw && link.to == a) ||
                                      (one_way && a == -1 && link.from == sw && link.to == b));
      const bool pair = a >= 0 && b >= 0 &&
                        ((link.from == a && link.to == b) ||
                         (!one_way && link.from == b && link.to == a));
      if (!nic && !nic_in && !pair) continue;
      found = true;
      if (fault.down()) {
        link.down = true;
        if (!down_links_.empty()) down_links_ += ", ";
        down_links_ += link.name;
      } else {
        link.bytes_per_second /= fault.slowdown();
      }
    }
    NEURON_CHECK(found, "fault names a link that does not exist: ",
                 a == -1 ? std::string("NIC") : "chip " + std::to_string(a), " -> ",
                 b == -1 ? std::string("NIC") : "chip " + std::to_string(b));
  }
}

const std::vector<int>& FabricGraph::TreeFrom(int src) const {
  std::call_once(tree_made_[src], [&] {
    // Dijkstra: cost = (latency, hops) compared in order.
    using Cost = std::tuple<double, int>;
    std::vector<Cost> best(num_vertices_, {std::numeric_limits<double>::infinity(), 0});
    std::vector<int> via(num_vertices_, -1);
    std::priority_queue<std::pair<Cost, int>, std::vector<std::pair<Cost, int>>,
                        std::greater<>> queue;
    best[src] = {0.0, 0};
    queue.push({best[src], src});
    while (!queue.empty()) {
      const auto [cost, v] = queue.top();
      queue.pop();
      if (cost > best[v]) continue;
      for (int id : out_links_[v]) {
        const Link& link = links_[id];
        if (link.down) continue;
        const Cost next{std::get<0>(cost) + link.latency.count(), std::get<1>(cost) + 1};
        if (next < best[link.to]) {
          best[link.to] = next;
          via[link.to] = id;
          queue.push({next, link.to});
        }
      }
    }
    trees_[src] = std::move(via);
  });
  return trees_[src];
}

const std::vector<int>& FabricGraph::TreeReaching(int from, int to) const {
  NEURON_CHECK(from >= 0 && from < num_chips_ && to >= 0 && to < num_chips_,
               "route between chips ", from, " and ", to, " outside the fabric's ",
               num_chips_, " chips");
  const std::vector<int>& via = TreeFrom(from);
  NEURON_CHECK(from == to || via[to] >= 0, "no route from chip ", from, " to chip ", to,
               " on the fabric: links down: ", down_links_);
  return via;
}

std::vector<int> FabricGraph::Route(int from, int to) const {
  std::vector<int> route;
  if (from == to) {
    TreeReaching(from, to);  // the range check
    return route;
  }
  ForEachLink(from, to, [&](int id) { route.push_back(id); });
  std::reverse(route.begin(), route.end());
  return route;
}

void CheckRoutes(const Topology& topology, std::uint32_t num_nodes,
                 const std::vector<std::uint32_t>& ranks_per_node) {
  if (topology.spec().faults().empty()) return;  // a whole torus or ring is connected
  const FabricGraph graph(topology, num_nodes);
  std::vector<int> chips;
  for (std::uint32_t node = 0; node < ranks_per_node.size(); ++node) {
    for (std::uint32_t local = 0; local < ranks_per_node[node]; ++local) {
      const int chip = static_cast<int>(topology.Place(node, local).chip);
      if (chips.empty() || chips.back() != chip) chips.push_back(chip);
    }
  }
  try {
    for (int from : chips) {
      for (int to : chips) graph.Route(from, to);
    }
  } catch (const InvalidUsage& e) {
    throw InvalidUsage(StrCat("topology ", topology.origin(), ": the job's ranks cannot all "
                              "reach each other: ", e.what()));
  }
}

}  // namespace neuron::runtime
