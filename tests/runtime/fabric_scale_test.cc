// What the fabric costs at scale: a topology's routes hold what the routes
// used need, not a link or tree entry per chip of the topology, and a
// collective's schedule holds O(ranks) transfers; the routes are those of
// a plain Dijkstra over every link.
#include <gtest/gtest.h>

#include <limits>
#include <queue>
#include <string>
#include <tuple>
#include <vector>

#include <google/protobuf/text_format.h>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/fabric_links.h"
#include "neuron/runtime/fabric/fabric_model.h"

namespace neuron::runtime {
namespace {

std::string Config(const std::string& name) {
  return std::string(NEURON_SOURCE_DIR) + "/configs/topologies/" + name + ".textproto";
}

Topology WithNodes(const std::string& name, int nodes, const std::string& extra = "") {
  const Topology t = Topology::FromFile(Config(name));
  proto::TopologySpec spec = t.spec();
  spec.set_num_nodes(static_cast<std::uint32_t>(nodes));
  std::string text;
  google::protobuf::TextFormat::PrintToString(spec, &text);
  return Topology::FromText(text + extra, name);
}

// The route from `from` to `to` by Dijkstra over every link (least latency,
// then fewest hops, then the lowest vertex first reached): the reference.
std::vector<int> ReferenceRoute(const FabricLinks& links, int from, int to) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(links.num_vertices()));
  for (int id = 0; id < links.num_links(); ++id) out[links.At(id).from].push_back(id);
  using Cost = std::tuple<double, int>;
  std::vector<Cost> best(out.size(), {std::numeric_limits<double>::infinity(), 0});
  std::vector<int> via(out.size(), -1);
  std::priority_queue<std::pair<Cost, int>, std::vector<std::pair<Cost, int>>, std::greater<>> q;
  best[from] = {0.0, 0};
  q.push({best[from], from});
  while (!q.empty()) {
    const auto [cost, v] = q.top();
    q.pop();
    if (cost > best[v]) continue;
    for (int id : out[v]) {
      const Hop hop = links.At(id);
      const Cost next{std::get<0>(cost) + hop.latency.count(), std::get<1>(cost) + 1};
      if (!hop.down && next < best[hop.to]) {
        best[hop.to] = next;
        via[hop.to] = id;
        q.push({next, hop.to});
      }
    }
  }
  std::vector<int> route;
  for (int v = to; v != from; v = links.At(via[v]).from) route.insert(route.begin(), via[v]);
  return route;
}

// Every pair's route, against the reference, on EFA nodes (faults in some;
// none: a route to node 2 walks node 1's branch moved one node on),
// NeuronSwitch nodes joined by EFA, one shared NeuronSwitch, and an
// UltraServer ring.
TEST(FabricScale, RoutesAreThoseOfDijkstraOverEveryLink) {
  const std::string faults =
      "faults { from_chip: 1 to_chip: 2 down: true } faults { from_chip: 5 to_chip: -1 down: true } "
      "faults { from_chip: 20 to_chip: 21 slowdown: 3 } "
      "faults { from_chip: -1 to_chip: 33 one_way: true down: true }";
  const std::vector<Topology> topologies = {
      WithNodes("trn2-node", 4, faults), WithNodes("trn2-node", 3), WithNodes("trn3-node", 3),
      WithNodes("trn3-ultraserver", 1), WithNodes("trn2-ultraserver", 4,
                                                 "faults { from_chip: 1 to_chip: 17 down: true }")};
  for (const Topology& topology : topologies) {
    const FabricGraph graph(topology, 0);
    const FabricLinks links(topology, 0);
    for (int a = 0; a < graph.num_chips(); ++a) {
      for (int b = 0; b < graph.num_chips(); ++b) {
        ASSERT_EQ(graph.Route(a, b), ReferenceRoute(links, a, b))
            << topology.origin() << ": chip " << a << " -> " << b;
      }
    }
  }
}

// A million chips (65,536 trn2 nodes) cost what two nodes do: the routes
// from a chip hold about two nodes' chips, whatever the node count.
TEST(FabricScale, RoutesHoldWhatTheyUseNotTheChipCount) {
  const FabricGraph small(WithNodes("trn2-node", 2), 0);
  const FabricGraph huge(WithNodes("trn2-node", 65536), 0);
  ASSERT_EQ(huge.num_chips(), 1 << 20);
  for (const FabricGraph* g : {&small, &huge}) {
    for (int to : {1, 17, g->num_chips() - 1}) g->Route(0, to);
  }
  EXPECT_EQ(huge.route_entries(), small.route_entries());
  EXPECT_LE(huge.route_entries(), 2u * (2 * 16 + 1));  // one tree: node 0, the EFA switch, a twin
  EXPECT_EQ(huge.Route(0, huge.num_chips() - 1).size(), 2u);  // NIC out, NIC in
  EXPECT_EQ(huge.link(huge.Route(3, huge.num_chips() - 1)[1]).name, "chip 1048575 NIC in");
}

// 65,536 nodes of a 16 x 16 x 16 torus have 2^31 links: refused, naming
// the counts, rather than numbered past an int.
TEST(FabricScale, AFabricOfMoreLinksThanAnIntNumbersIsRefused) {
  const Topology big = Topology::FromText(
      "chips_per_node: 4096 torus_dims: [16, 16, 16] num_nodes: 65536 ranks_per_chip: 1 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 1 } "
      "inter_node_link { bandwidth_gbps: 25 latency_us: 15 }",
      "big");
  try {
    const FabricGraph graph(big, 0);
    FAIL() << "numbered " << graph.num_links() << " links";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("65536 nodes of 4096 chips have 2147483648 links"),
              std::string::npos)
        << e.what();
  }
}

// A ring collective holds one step's transfers, repeated, and a mesh its
// ranks: O(ranks), where they held n - 1 steps of n transfers or n^2.
TEST(FabricScale, SchedulesHoldTransfersLinearInRanks) {
  const Topology topology = WithNodes("trn2-node", 64);
  const FabricModel model(topology, PlaceRanks(topology, std::vector<std::uint32_t>(64, 16)));
  const int n = 1024;
  for (auto algorithm : {FabricAlgorithm::kRing, FabricAlgorithm::kMesh,
                         FabricAlgorithm::kHierarchical, FabricAlgorithm::kRdh}) {
    const Schedule s =
        BuildSchedule(model, {CollectiveKind::kAllGather, 1 << 20, AllRanks(n), 0}, algorithm);
    std::size_t held = 0;
    for (const Step& step : s.steps) held += step.transfers.size() + step.mesh.size();
    EXPECT_LE(held, 16u * n) << s.algorithm;
  }
  const Schedule ring =
      BuildSchedule(model, {CollectiveKind::kAllGather, 1 << 20, AllRanks(n), 0},
                    FabricAlgorithm::kRing);
  EXPECT_EQ(StepCount(ring), static_cast<std::size_t>(n - 1));
  EXPECT_EQ(model.Simulate(ring).steps.size(), static_cast<std::size_t>(n - 1));
}

}  // namespace
}  // namespace neuron::runtime
