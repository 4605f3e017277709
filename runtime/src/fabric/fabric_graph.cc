#include "neuron/runtime/fabric/fabric_graph.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <queue>
#include <tuple>

#include "neuron/runtime/error.h"

namespace neuron::runtime {

namespace {
std::atomic<std::uint64_t> next_serial{1};
}  // namespace

FabricGraph::FabricGraph(const Topology& topology, std::uint32_t job_nodes)
    : links_(topology, job_nodes), serial_(next_serial++) {}

Link FabricGraph::link(int id) const {
  const Hop hop = links_.At(id);
  return Link{hop.from, hop.to, hop.bytes_per_second, hop.latency, links_.Name(id), hop.down};
}

int FabricGraph::Tree::Index(int v, const FabricLinks& links) const {
  if (all) return v;
  const int cpn = links.chips_per_node();
  if (v < links.num_chips()) {
    if (v / cpn == source_node) return v % cpn;
    if (v / cpn == remote_node) return cpn + v % cpn;
    return -1;
  }
  const auto it = std::lower_bound(hubs.begin(), hubs.end(), v);
  if (it == hubs.end() || *it != v) return -1;
  return 2 * cpn + static_cast<int>(it - hubs.begin());
}

int FabricGraph::TemplateNode(int node) const {
  for (int n = 0; n < links_.num_nodes(); ++n) {
    if (n != node && !links_.Faulty(n)) return n;
  }
  return -1;
}

FabricGraph::Tree FabricGraph::MakeTree(int from, int remote) const {
  Tree tree;
  const int cpn = links_.chips_per_node();
  tree.source_node = from / cpn;
  tree.remote_node = remote;
  tree.all = !links_.RoutesThroughHub();
  std::vector<int> held;  // the vertices held, for the search
  if (tree.all) {
    for (int v = 0; v < links_.num_vertices(); ++v) held.push_back(v);
  } else {
    for (int node : {tree.source_node, remote}) {
      if (node < 0) continue;
      for (int c = 0; c < cpn; ++c) held.push_back(node * cpn + c);
      if (links_.NodeSwitch(node) >= 0) tree.hubs.push_back(links_.NodeSwitch(node));
    }
    if (links_.efa_switch() >= 0) tree.hubs.push_back(links_.efa_switch());
    std::sort(tree.hubs.begin(), tree.hubs.end());
    tree.hubs.erase(std::unique(tree.hubs.begin(), tree.hubs.end()), tree.hubs.end());
    held.insert(held.end(), tree.hubs.begin(), tree.hubs.end());
  }
  const std::size_t size = tree.all ? held.size() : 2 * cpn + tree.hubs.size();
  // Dijkstra: cost = (latency, hops) compared in order, then the vertex id.
  using Cost = std::tuple<double, int>;
  std::vector<Cost> best(size, {std::numeric_limits<double>::infinity(), 0});
  tree.via.assign(size, -1);
  std::priority_queue<std::pair<Cost, int>, std::vector<std::pair<Cost, int>>, std::greater<>>
      queue;
  best[static_cast<std::size_t>(tree.Index(from, links_))] = {0.0, 0};
  queue.push({{0.0, 0}, from});
  auto relax = [&](const Cost& cost, int id) {
    const Hop hop = links_.At(id);
    const int to = tree.Index(hop.to, links_);
    if (hop.down || to < 0) return;
    const Cost next{std::get<0>(cost) + hop.latency.count(), std::get<1>(cost) + 1};
    if (next < best[static_cast<std::size_t>(to)]) {
      best[static_cast<std::size_t>(to)] = next;
      tree.via[static_cast<std::size_t>(to)] = id;
      queue.push({next, hop.to});
    }
  };
  while (!queue.empty()) {
    const auto [cost, v] = queue.top();
    queue.pop();
    if (cost > best[static_cast<std::size_t>(tree.Index(v, links_))]) continue;
    if (v < links_.num_chips()) {
      links_.ForEachFromChip(v, [&](int id) { relax(cost, id); });
      continue;
    }
    for (int chip : held) {  // a hub: its links to the chips held
      if (chip >= links_.num_chips()) break;
      const int id = links_.HubToChip(v, chip);
      if (id >= 0) relax(cost, id);
    }
  }
  return tree;
}

const FabricGraph::Tree& FabricGraph::TreeFor(int from, int remote) const {
  // The last tree this thread asked for, of which graph: a model asks for
  // the same one transfer after transfer (a mesh's are by source). Graphs
  // are told apart by a serial number (an address can be reused), and a
  // graph never frees a tree it made.
  struct Last {
    std::uint64_t graph = 0, key = 0;
    const Tree* tree = nullptr;
  };
  thread_local Last last;
  const std::uint64_t key = static_cast<std::uint64_t>(from) << 32 |
                            static_cast<std::uint32_t>(remote + 1);
  if (last.graph == serial_ && last.key == key) return *last.tree;
  std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = trees_[key];
  if (!slot) slot = std::make_unique<Tree>(MakeTree(from, remote));
  last = {serial_, key, slot.get()};
  return *slot;
}

FabricGraph::View FabricGraph::Reaching(int from, int to) const {
  const int chips = links_.num_chips();
  NEURON_CHECK(from >= 0 && from < chips && to >= 0 && to < chips, "route between chips ", from,
               " and ", to, " outside the fabric's ", chips, " chips");
  const int cpn = links_.chips_per_node();
  const int a = from / cpn, b = to / cpn;
  View view{nullptr, to, 0};
  if (!links_.RoutesThroughHub()) {
    view.tree = &TreeFor(from, -1);
  } else if (b != a && links_.Faulty(b)) {
    view.tree = &TreeFor(from, b);
  } else {
    const int twin = TemplateNode(a);
    view.tree = &TreeFor(from, twin);
    if (b != a && b != twin) {
      view.shift = b - twin;
      view.target = to - view.shift * cpn;
    }
  }
  const int index = view.tree->Index(view.target, links_);
  NEURON_CHECK(from == to || (index >= 0 && view.tree->via[static_cast<std::size_t>(index)] >= 0),
               "no route from chip ", from, " to chip ", to,
               " on the fabric: links down: ", links_.down_links());
  return view;
}

std::vector<int> FabricGraph::Route(int from, int to) const {
  std::vector<int> route;
  if (from == to) {
    Reaching(from, to);  // the range check
    return route;
  }
  ForEachLink(from, to, [&](int id) { route.push_back(id); });
  std::reverse(route.begin(), route.end());
  return route;
}

std::size_t FabricGraph::route_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const auto& [key, tree] : trees_) n += tree->via.size() + tree->hubs.size();
  return n;
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
