// The fabric model held against Neuron's published nccom-test runs
// (aws-neuron-sdk, tools/neuron-sys-tools/nccom-test.rst; the table and the
// rank mapping each row assumes are in docs/collectives.md, "Calibration"):
// within 15% of the published time at 1 MiB and above on Trn1, 25% on Trn2,
// and within 2x below 1 MiB.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "error_of.h"
#include "fabric_closed_forms.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "neuron/runtime/topology.h"

namespace neuron::runtime {
namespace {

struct Published {
  const char* topology;  // configs/topologies/<name>.textproto
  const char* device;    // configs/devices/<name>.textproto
  int nodes;
  int ranks;             // in all, split evenly over the nodes
  const char* kind;
  double bytes;
  double micros;         // published
  double large_tolerance;  // relative, at 1 MiB and above
  const char* algorithm;   // the model's: Neuron's, or ring for its KangaRing
};

constexpr double kMiB = 1 << 20;

// Every row docs/collectives.md's calibration table holds (nccom-test.rst).
const std::vector<Published>& Rows() {
  static const std::vector<Published> rows = {
      // 1 node, 2 ranks, all-reduce fp32 (Trn1, 2023).
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 1 * kMiB, 68, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 4 * kMiB, 107, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 16 * kMiB, 332, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 64 * kMiB, 1214, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 256 * kMiB, 4750, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 1, 2, "allreduce", 1024 * kMiB, 18930, 0.15, "ring"},
      // 2 nodes x 32 ranks over EFA, all-reduce fp32 (trn1.32xlarge).
      {"trn1-node", "neuroncore-v2", 2, 64, "allreduce", 1 * kMiB, 1328, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 2, 64, "allreduce", 16 * kMiB, 2138, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 2, 64, "allreduce", 64 * kMiB, 3963, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 2, 64, "allreduce", 256 * kMiB, 11954, 0.15, "ring"},
      {"trn1-node", "neuroncore-v2", 2, 64, "allreduce", 1024 * kMiB, 41806, 0.15, "ring"},
      // 16 ranks, all-reduce fp32 (Trn2, LNC=2: 4 ranks on each of 4 chips).
      {"trn2-node-lnc2", "neuroncore-v3", 1, 16, "allreduce", 4, 299.91, 0.25, "mesh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 16, "allreduce", 131072, 574.15, 0.25, "mesh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 16, "allreduce", 2 * kMiB, 686.32, 0.25, "rdh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 16, "allreduce", 32 * kMiB, 2754.15, 0.25, "ring"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 16, "allreduce", 512 * kMiB, 9689.51, 0.25, "ring"},
      // 8 ranks, all-gather, p50 (Trn2, LNC=2: 4 ranks on each of 2 chips).
      {"trn2-node-lnc2", "neuroncore-v3", 1, 8, "allgather", 1024, 10, 0.25, "mesh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 8, "allgather", 8192, 10, 0.25, "mesh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 8, "allgather", 65536, 11, 0.25, "mesh"},
      {"trn2-node-lnc2", "neuroncore-v3", 1, 8, "allgather", 524288, 15, 0.25, "mesh"},
  };
  return rows;
}

std::string Config(const std::string& dir, const std::string& name) {
  return std::string(NEURON_SOURCE_DIR) + "/configs/" + dir + "/" + name + ".textproto";
}

CollectiveCost Model(const Published& row) {
  const Topology topology = Topology::FromFile(Config("topologies", row.topology));
  const DeviceSpec device = DeviceSpec::FromFile(Config("devices", row.device));
  const auto per_node = static_cast<std::uint32_t>(row.ranks / row.nodes);
  FabricModel model(topology, PlaceRanks(topology, std::vector<std::uint32_t>(row.nodes, per_node)),
                    device);
  return ModelCollective(model, row.kind, row.bytes, AllRanks(row.ranks), 0);
}

TEST(FabricCalibration, EveryPublishedRowWithinItsTolerance) {
  std::printf("%-15s %5s %9s %12s %12s %12s %7s %s\n", "topology", "ranks", "op", "bytes",
              "published", "modelled", "ratio", "algorithm");
  for (const Published& row : Rows()) {
    const CollectiveCost cost = Model(row);
    const double ratio = cost.micros / row.micros;
    std::printf("%-15s %5d %9s %12.0f %12.2f %12.2f %7.3f %s\n", row.topology, row.ranks,
                row.kind, row.bytes, row.micros, cost.micros, ratio, cost.algorithm);
    const std::string where = std::string(row.topology) + ", " + std::to_string(row.ranks) +
                              " ranks, " + row.kind + " of " + std::to_string(row.bytes) + " B";
    EXPECT_STREQ(cost.algorithm, row.algorithm) << where;
    if (row.bytes >= kMiB) {
      EXPECT_NEAR(ratio, 1.0, row.large_tolerance) << where;
    } else {
      EXPECT_GE(ratio, 0.5) << where;
      EXPECT_LE(ratio, 2.0) << where;
    }
  }
}

// The mechanics, on the test topologies of fabric_closed_forms.h.

std::string Calibration(const std::string& fields) {
  return "collective_engine { calibration { " + fields + " } }";
}

double Micros(const FabricModel& model, CollectiveKind kind, double bytes,
              FabricAlgorithm algorithm) {
  return Seconds(model, kind, bytes, algorithm) * 1e6;
}

// Two nodes of 4 chips (a ring each), EFA NICs of 10 GB/s per chip.
Topology TwoNodeRings(const std::string& extra) {
  return Topology::FromText(
      "chips_per_node: 4 torus_dims: [4] ranks_per_chip: 1 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "inter_node_link { bandwidth_gbps: 10 latency_us: 2 } " + extra, "two-node-test");
}

TEST(FabricCalibration, LaunchAlgorithmAndStepCostsAddToTheWire) {
  // The every-kind ring entry comes first; allreduce's own still counts.
  const std::string costs = Calibration(
      "launch_us: 7 "
      "algorithm_costs { algorithm: 'ring' fixed_us: 5 } "
      "algorithm_costs { algorithm: 'ring' kind: 'allreduce' fixed_us: 11 step_us: 3 } "
      "algorithm_costs { algorithm: 'mesh' kind: 'allreduce' step_us: 2 }");
  const Topology calibrated = RingTopology(4, costs), bare = RingTopology(4);
  const FabricModel with(calibrated, PlaceRanks(calibrated, {4}));
  const FabricModel without(bare, PlaceRanks(bare, {4}));
  auto extra = [&](CollectiveKind kind, FabricAlgorithm a) {
    const double s = 1 << 20;
    return Micros(with, kind, s, a) - Micros(without, kind, s, a);
  };
  // Ring allreduce: 6 steps of one peer; allgather: the every-kind entry.
  EXPECT_NEAR(extra(CollectiveKind::kAllReduce, FabricAlgorithm::kRing), 7 + 11 + 6 * 3, 1e-6);
  EXPECT_NEAR(extra(CollectiveKind::kAllGather, FabricAlgorithm::kRing), 7 + 5, 1e-6);
  // Mesh allreduce: 2 steps in which every rank sends to its 3 peers.
  EXPECT_NEAR(extra(CollectiveKind::kAllReduce, FabricAlgorithm::kMesh), 7 + 2 * 3 * 2, 1e-6);
  EXPECT_NEAR(extra(CollectiveKind::kAllGather, FabricAlgorithm::kMesh), 7, 1e-6);
  // A schedule that is no collective (point-to-point) pays only the wire,
  // and an empty step nothing.
  Schedule p2p{"p2p", {Step{{Transfer{0, 1, 4096}}}, Step{}}};
  EXPECT_DOUBLE_EQ(with.Simulate(p2p).total.count(), without.Simulate(p2p).total.count());
  // One rank: nothing moves, nothing is paid.
  EXPECT_EQ(with.Simulate(BuildSchedule(with, {CollectiveKind::kAllReduce, 1 << 20, {0}, 0},
                                        FabricAlgorithm::kRing)).total.count(), 0);
}

TEST(FabricCalibration, PipelinedChunksPayTheStepCostEachAndTheLaunchOnce) {
  const Topology calibrated = TwoNodeRings(
      "collective_engine { min_chunk_bytes: 1024 max_chunks: 8 calibration { launch_us: 7 "
      "algorithm_costs { algorithm: 'hierarchical' kind: 'reducescatter' fixed_us: 5 "
      "step_us: 3 } } }");
  const Topology bare = TwoNodeRings("collective_engine { min_chunk_bytes: 1024 max_chunks: 8 }");
  const FabricModel with(calibrated, PlaceRanks(calibrated, {4, 4}));
  const FabricModel without(bare, PlaceRanks(bare, {4, 4}));
  // Reduce-scatter over a ring of 4 then across 2 nodes: stages of 3 and 1
  // steps; with k chunks on disjoint links the flow shop gives the first
  // chunk through both stages plus k - 1 times the slower one.
  const CollectiveShape shape{CollectiveKind::kReduceScatter, 64 << 20, AllRanks(8), 0};
  Schedule a = BuildSchedule(with, shape, FabricAlgorithm::kHierarchical);
  Schedule b = BuildSchedule(without, shape, FabricAlgorithm::kHierarchical);
  ASSERT_EQ(a.stages.size(), 2u);
  a.chunks = b.chunks = 4;
  const SimulationResult rw = with.Simulate(a), rb = without.Simulate(b);
  for (std::size_t i = 0; i < 2; ++i) {
    double steps = 0;
    for (std::size_t e = a.stages[i].first_step; e < a.stages[i].end_step; ++e) {
      steps += static_cast<double>(a.steps[e].repeat);
    }
    EXPECT_NEAR(rw.stages[i].count(), rb.stages[i].count() + 3 * steps, 1e-9) << i;
  }
  const double slowest = std::max(rw.stages[0].count(), rw.stages[1].count());
  EXPECT_NEAR(rw.total.count(),
              7 + 5 + rw.stages[0].count() + rw.stages[1].count() + 3 * slowest, 1e-6);
}

TEST(FabricCalibration, CoreDmaRateCapsWhatARankSendsAndWhatItReceives) {
  // 8 cores to a rank at 10 GB/s each: 80 GB/s, below the 100 GB/s links.
  const std::string cap = Calibration("core_dma_gbps: 10");
  const Topology ring = RingTopology(4, cap);
  ASSERT_EQ(CoresPerRank(ring), 8);
  const FabricModel model(ring, PlaceRanks(ring, {4}));
  const double s = 4 << 20, rank_rate = 80e9;
  ExpectClose(Seconds(model, CollectiveKind::kAllGather, s, FabricAlgorithm::kRing),
              3 * Hop(s / 4, kA, rank_rate), "ring allgather at the DMA rate");
  // Over a switch (a NIC each way per rank, 100 GB/s), fan-in and fan-out:
  // the receiver's or the sender's DMA shared three ways binds (80/3 < 100/3).
  const Topology sw = SwitchTopology(cap);
  const FabricModel four(sw, PlaceRanks(sw, {1, 1, 1, 1}));
  const double x = 1 << 20;
  const Schedule fan_in{"fan-in", {Step{{{1, 0, x}, {2, 0, x}, {3, 0, x}}}}};
  const Schedule fan_out{"fan-out", {Step{{{0, 1, x}, {0, 2, x}, {0, 3, x}}}}};
  ExpectClose(ToSeconds(four.Simulate(fan_in).total), Hop(x, kA, rank_rate / 3),
              "fan-in: the receiver's DMA");
  ExpectClose(ToSeconds(four.Simulate(fan_out).total), Hop(x, kA, rank_rate / 3),
              "fan-out: the sender's DMA");
  // Without the cap the NICs bind.
  const Topology free_sw = SwitchTopology();
  const FabricModel uncapped(free_sw, PlaceRanks(free_sw, {1, 1, 1, 1}));
  ExpectClose(ToSeconds(uncapped.Simulate(fan_in).total), Hop(x, kA, kB / 3), "fan-in: NIC");
}

TEST(FabricCalibration, RulesChooseNeuronsAlgorithmWhereItRuns) {
  const std::string rules = Calibration(
      "algorithm_rules { kind: 'allreduce' max_bytes: 4096 algorithm: 'ring' } "
      "algorithm_rules { kind: 'allreduce' min_bytes: 4096 span: ACROSS_NODES algorithm: 'ring' } "
      "algorithm_rules { kind: 'allreduce' min_bytes: 4096 span: WITHIN_NODE algorithm: 'rdh' }");
  const Topology ruled = RingTopology(8, rules), bare = RingTopology(8);
  const FabricModel model(ruled, PlaceRanks(ruled, {8}));
  const FabricModel fastest(bare, PlaceRanks(bare, {8}));
  auto choice = [](const FabricModel& m, CollectiveKind kind, double bytes, int ranks) {
    return std::string(Name(ChooseAlgorithm(m, {kind, bytes, AllRanks(ranks), 0})));
  };
  // 1 KiB: the model rates mesh fastest, the rule says ring.
  ASSERT_EQ(choice(fastest, CollectiveKind::kAllReduce, 1024, 8), "mesh");
  EXPECT_EQ(choice(model, CollectiveKind::kAllReduce, 1024, 8), "ring");
  // 1 MiB within a node: the across-nodes rule does not hold, rdh's does.
  EXPECT_EQ(choice(model, CollectiveKind::kAllReduce, 1 << 20, 8), "rdh");
  // rdh cannot run 6 ranks: the model's fastest, as without rules.
  EXPECT_EQ(choice(model, CollectiveKind::kAllReduce, 1 << 20, 6),
            choice(fastest, CollectiveKind::kAllReduce, 1 << 20, 6));
  // No rule for allgather.
  EXPECT_EQ(choice(model, CollectiveKind::kAllGather, 1 << 20, 8),
            choice(fastest, CollectiveKind::kAllGather, 1 << 20, 8));
  // Across nodes (8 nodes of 1 chip over EFA): the across-nodes rule, and
  // not the within-node one.
  const Topology nodes = SwitchTopology(rules), bare_nodes = SwitchTopology();
  const FabricModel spread(nodes, PlaceRanks(nodes, std::vector<std::uint32_t>(8, 1)));
  const FabricModel spread_fastest(bare_nodes,
                                   PlaceRanks(bare_nodes, std::vector<std::uint32_t>(8, 1)));
  ASSERT_NE(choice(spread_fastest, CollectiveKind::kAllReduce, 1 << 20, 8), "ring");
  EXPECT_EQ(choice(spread, CollectiveKind::kAllReduce, 1 << 20, 8), "ring");
  // The cost the choice reports is the chosen schedule's.
  const CollectiveCost cost = ModelCollective(model, "allreduce", 1024, AllRanks(8), 0);
  EXPECT_STREQ(cost.algorithm, "ring");
  EXPECT_DOUBLE_EQ(cost.micros, Micros(model, CollectiveKind::kAllReduce, 1024,
                                       FabricAlgorithm::kRing));
}

// The chips of node 0 that transfers of `step` leave it from.
std::vector<int> Leaving(const FabricModel& model, const Step& step) {
  std::vector<int> chips;
  for (const Transfer& t : step.transfers) {
    if (model.placement()[t.src].node == 0 && model.placement()[t.dst].node == 1) {
      chips.push_back(static_cast<int>(model.placement()[t.src].chip));
    }
  }
  std::sort(chips.begin(), chips.end());
  return chips;
}

TEST(FabricCalibration, InterNodeRingChannelsLeaveEachNodeFromOtherChips) {
  const Topology four = TwoNodeRings(Calibration("inter_node_ring_channels: 4"));
  const Topology one = TwoNodeRings("");
  const FabricModel channels(four, PlaceRanks(four, {4, 4}));
  const FabricModel single(one, PlaceRanks(one, {4, 4}));
  const CollectiveShape shape{CollectiveKind::kAllReduce, 64 << 20, AllRanks(8), 0};
  const Schedule s = BuildSchedule(channels, shape, FabricAlgorithm::kRing);
  ASSERT_EQ(StepCount(s), 14u);
  // Every step: 4 rings of 8 transfers, each a quarter of a chunk (the
  // buffer over 8 ranks).
  EXPECT_EQ(s.steps[0].transfers.size(), 32u);
  for (const Transfer& t : s.steps[0].transfers) EXPECT_DOUBLE_EQ(t.bytes, (64 << 20) / 8.0 / 4.0);
  EXPECT_EQ(Leaving(channels, s.steps[0]), (std::vector<int>{0, 1, 2, 3}));
  // The same bytes cross the fabric; spread over 4 NICs they cross faster.
  const SimulationResult spread = channels.Simulate(s);
  const SimulationResult narrow =
      single.Simulate(BuildSchedule(single, shape, FabricAlgorithm::kRing));
  EXPECT_NEAR(spread.link_bytes, narrow.link_bytes, 1e-6 * narrow.link_bytes);
  EXPECT_LT(spread.total.count(), 0.5 * narrow.total.count());
  // No more channels than the fewest ranks a node has: 2 with 2 per node,
  // 1 (the ring itself) with 1; within one node, one ring.
  const FabricModel two_each(four, PlaceRanks(four, {2, 2}));
  const Schedule two = BuildSchedule(two_each, {CollectiveKind::kAllReduce, 1 << 20, AllRanks(4),
                                                0}, FabricAlgorithm::kRing);
  EXPECT_EQ(two.steps[0].transfers.size(), 8u);
  EXPECT_EQ(Leaving(two_each, two.steps[0]), (std::vector<int>{0, 1}));
  const FabricModel one_each(four, PlaceRanks(four, {1, 1}));
  EXPECT_EQ(BuildSchedule(one_each, {CollectiveKind::kAllReduce, 1 << 20, AllRanks(2), 0},
                          FabricAlgorithm::kRing).steps[0].transfers.size(), 2u);
  const FabricModel node(four, PlaceRanks(four, {4}));
  EXPECT_EQ(BuildSchedule(node, {CollectiveKind::kAllReduce, 1 << 20, AllRanks(4), 0},
                          FabricAlgorithm::kRing).steps[0].transfers.size(), 4u);
}

TEST(FabricCalibration, BadCalibrationNamesTheFileAndField) {
  using testing::ErrorOf;
  auto model_of = [](const std::string& fields) {
    return [fields] {
      const Topology t = Topology::FromText(
          "chips_per_node: 4 torus_dims: [4] ranks_per_chip: 1 "
          "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
          "inter_node_link { bandwidth_gbps: 100 latency_us: 2 } " + Calibration(fields),
          "bad.textproto");
      FabricModel(t, PlaceRanks(t, {4}));
    };
  };
  const std::string at = "topology bad.textproto: collective_engine.calibration.";
  const std::pair<const char*, std::string> cases[] = {
      {"launch_us: -1", at + "launch_us must be a finite number >= 0, got -1"},
      {"core_dma_gbps: inf", at + "core_dma_gbps must be a finite number >= 0, got inf"},
      {"algorithm_costs { algorithm: 'kangaring' }",
       at + "algorithm_costs[0].algorithm names algorithm 'kangaring' (ring, mesh, rdh, "
            "recursive_doubling, hierarchical, tree)"},
      {"algorithm_costs { algorithm: 'auto' }", at + "algorithm_costs[0].algorithm names "
                                                     "algorithm 'auto'"},
      {"algorithm_costs { algorithm: 'ring' kind: 'allgathr' }",
       at + "algorithm_costs[0].kind names kind 'allgathr' (allreduce, allgather"},
      {"algorithm_costs { algorithm: 'ring' kind: 'allreduce' } "
       "algorithm_costs { algorithm: 'ring' kind: 'allreduce' }",
       at + "algorithm_costs[1] repeats algorithm_costs[0] (ring, allreduce)"},
      {"algorithm_costs { algorithm: 'ring' step_us: -2 }",
       at + "algorithm_costs[0].step_us must be a finite number >= 0, got -2"},
      {"algorithm_rules { kind: 'allreduc' algorithm: 'ring' }",
       at + "algorithm_rules[0].kind names kind 'allreduc'"},
      {"algorithm_rules { min_bytes: 10 max_bytes: 10 algorithm: 'ring' }",
       at + "algorithm_rules[0] holds for no size (min_bytes 10, max_bytes 10)"},
      {"algorithm_rules { algorithm: '' }", at + "algorithm_rules[0].algorithm names algorithm ''"},
      {"inter_node_ring_channels: 33",
       at + "inter_node_ring_channels is 33; Neuron runs at most 32"},
  };
  for (const auto& [fields, expected] : cases) {
    const std::string message = ErrorOf(model_of(fields));
    EXPECT_NE(message.find(expected), std::string::npos) << fields << ": " << message;
  }
}

// The topologies of one generation carry one calibration.
TEST(FabricCalibration, EachGenerationsTopologiesShareTheirCalibration) {
  auto calibration = [](const std::string& name) {
    return Topology::FromFile(Config("topologies", name))
        .spec().collective_engine().calibration().SerializeAsString();
  };
  EXPECT_EQ(calibration("trn2-node"), calibration("trn2-node-lnc2"));
  EXPECT_EQ(calibration("trn2-node"), calibration("trn2-ultraserver"));
  EXPECT_EQ(calibration("trn1-node"), calibration("trn1n-node"));
  EXPECT_NE(calibration("trn1-node"), calibration("trn2-node"));
  // The embedded default is trn2-node's file.
  EXPECT_EQ(Topology::Default().spec().collective_engine().calibration().SerializeAsString(),
            calibration("trn2-node"));
}

}  // namespace
}  // namespace neuron::runtime
