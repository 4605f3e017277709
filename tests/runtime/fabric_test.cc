// The fabric model against the closed-form alpha-beta costs
// (../shared/REFERENCE.md) on uncontended topologies, with the reduction's
// cost on reduce-scatter steps, plus contention and faults. Chunked
// pipelines, hierarchies, all-to-all, one-way faults and the algorithm
// choice: fabric_pipeline_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_schedules.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/fabric_model.h"
#include "fabric_closed_forms.h"

namespace neuron::runtime {
namespace {

const double kSizes[] = {1024, 1 << 20, 64 << 20, 256.0 * (1 << 20)};

TEST(FabricModel, RingAllReduceMatchesClosedForm) {
  for (int n : {4, 8, 16}) {
    const Topology topo = RingTopology(n);
    const FabricModel model(topo, PlaceRanks(topo, {static_cast<std::uint32_t>(n)}));
    for (double s : kSizes) {
      const double expected = (n - 1) * (ReduceHop(s / n) + Hop(s / n));
      ExpectClose(Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRing),
                  expected, "ring allreduce n=" + std::to_string(n));
    }
  }
}

TEST(FabricModel, RingAllGatherMatchesClosedForm) {
  for (int n : {4, 8, 16}) {
    const Topology topo = RingTopology(n);
    const FabricModel model(topo, PlaceRanks(topo, {static_cast<std::uint32_t>(n)}));
    for (double s : kSizes) {
      const double expected = (n - 1) * kA + (n - 1.0) / n * s / kB;
      ExpectClose(Seconds(model, CollectiveKind::kAllGather, s, FabricAlgorithm::kRing),
                  expected, "ring allgather n=" + std::to_string(n));
    }
  }
}

TEST(FabricModel, RecursiveDoublingAndRabenseifnerMatchClosedForm) {
  const Topology topo = SwitchTopology();
  for (std::uint32_t n : {2u, 4u, 8u, 16u}) {
    const FabricModel model(topo, PlaceRanks(topo, std::vector<std::uint32_t>(n, 1)));
    const double logn = std::log2(n);
    for (double s : kSizes) {
      ExpectClose(
          Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRecursiveDoubling),
          logn * ReduceHop(s), "recursive doubling n=" + std::to_string(n));
      double rabenseifner = 0;  // halving (reducing) steps, then doubling ones
      for (std::uint32_t d = 2; d <= n; d *= 2) rabenseifner += ReduceHop(s / d) + Hop(s / d);
      ExpectClose(Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRdh),
                  rabenseifner, "rabenseifner n=" + std::to_string(n));
    }
  }
}

TEST(FabricModel, SnakeRingOnTheTrn2TorusUsesOnlyDirectLinks) {
  const Topology topo = Uncalibrated(Topology::Default());
  const FabricModel model(topo, PlaceRanks(topo, {16}));
  const auto ring = RingOrder(model, AllRanks(16));
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(model.graph().Route(ring[i], ring[(i + 1) % 16]).size(), 1u)
        << "ring edge " << ring[i] << " -> " << ring[(i + 1) % 16];
  }
  const auto& link = topo.spec().intra_node_link();
  const double s = 64 << 20, b = link.bandwidth_gbps() * 1e9, a = link.latency_us() * 1e-6;
  ExpectClose(Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRing),
              15 * (ReduceHop(s / 16, a, b) + Hop(s / 16, a, b)), "trn2 ring allreduce");
}

TEST(FabricModel, ReductionRunsAtHalfTheDmaRateOrTheHbmRate) {
  // NeuronCore-v3: DMA 16 x 23 GB/s at half rate = 184 GB/s per core; HBM
  // 362.5 GB/s per core over 3 bytes moved per byte reduced = 120.8 GB/s.
  EXPECT_DOUBLE_EQ(ReductionBytesPerSecond(DeviceSpec::Default(), 1), 362.5e9 / 3);
  EXPECT_DOUBLE_EQ(ReductionBytesPerSecond(DeviceSpec::Default(), 8), 8 * 362.5e9 / 3);
  EXPECT_DOUBLE_EQ(ReductionBytesPerSecond(DeviceWithHbm(600), 2), 2 * 16 * 23e9 * 0.5);
  EXPECT_DOUBLE_EQ(ChipReductionRate(), 8 * 362.5e9 / 3);
}

TEST(FabricModel, ReducersReceivingAtOnceShareTheirRate) {
  // Mesh reduce-scatter on 4 ranks behind one switch: each rank receives
  // three shares at once over its NIC and reduces them; with HBM at 15 GB/s
  // per core the reduction (40 GB/s per rank) is slower than the wire.
  const Topology topo = SwitchTopology();
  const FabricModel model(topo, PlaceRanks(topo, {1, 1, 1, 1}), DeviceWithHbm(15));
  const double s = 64 << 20, share = s / 4;
  const double w = share / (kB / 3), r = share / (8 * 15e9 / 3 / 3);
  ASSERT_GT(r, w);
  ExpectClose(Seconds(model, CollectiveKind::kReduceScatter, s, FabricAlgorithm::kMesh),
              kA + (w + r + r) / 2, "mesh reduce-scatter, reduction-bound");
}

TEST(FabricModel, TransfersSharingALinkShareItsBandwidth) {
  const Topology topo = RingTopology(4);
  const FabricModel model(topo, PlaceRanks(topo, {4}));
  const double s = 1e9;
  // 0->2 goes 0->1->2 and shares link 1->2 with 1->2.
  const Schedule shared{"test", {Step{{{0, 2, s}, {1, 2, s}}}}};
  EXPECT_NEAR(ToSeconds(model.Simulate(shared).total), 2 * kA + s / (kB / 2), 1e-9);
  const Schedule alone{"test", {Step{{{1, 2, s}}}}};
  EXPECT_NEAR(ToSeconds(model.Simulate(alone).total), kA + s / kB, 1e-9);
}

TEST(FabricModel, SlowLinkSlowsEveryRingStep) {
  const Topology topo = RingTopology(8, "faults { from_chip: 2 to_chip: 3 slowdown: 4 }");
  const FabricModel model(topo, PlaceRanks(topo, {8}));
  const double s = 64 << 20;
  ExpectClose(Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRing),
              7 * (ReduceHop(s / 8, kA, kB / 4) + Hop(s / 8, kA, kB / 4)),
              "ring allreduce, one link 4x slower");
}

TEST(FabricModel, DownLinkIsRoutedAroundOrNamed) {
  const Topology ring = RingTopology(4, "faults { from_chip: 0 to_chip: 1 down: true }");
  const FabricModel model(ring, PlaceRanks(ring, {4}));
  EXPECT_EQ(model.graph().Route(0, 1).size(), 3u);  // 0 -> 3 -> 2 -> 1
  // Two chips with their only link down: no route, and the error names it.
  const Topology pair = RingTopology(2, "faults { from_chip: 0 to_chip: 1 down: true }");
  const FabricModel cut(pair, PlaceRanks(pair, {2}));
  try {
    cut.graph().Route(0, 1);
    FAIL() << "routed over a down link";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("links down: chip 0 -> chip 1"), std::string::npos)
        << e.what();
  }
  // A NIC down on EFA: traffic leaves through a neighbour's NIC.
  const Topology efa = Topology::FromText(
      "chips_per_node: 2 torus_dims: [2] ranks_per_chip: 1 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "inter_node_link { bandwidth_gbps: 25 latency_us: 15 } "
      "faults { from_chip: 0 to_chip: -1 down: true }",
      "efa-test");
  const FabricModel two_nodes(efa, PlaceRanks(efa, {2, 2}));
  const auto& route = two_nodes.graph().Route(0, 2);
  ASSERT_EQ(route.size(), 3u);
  EXPECT_EQ(two_nodes.graph().link(route[1]).name, "chip 1 NIC out");
}

TEST(FabricGraph, CheckRoutesRefusesAJobThatFaultsCutApart) {
  const Topology pair = RingTopology(2, "faults { from_chip: 0 to_chip: 1 down: true }");
  try {
    CheckRoutes(pair, 1, {2});
    FAIL() << "accepted a job whose two chips cannot reach each other";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("the job's ranks cannot all reach each other: no route "
                                         "from chip 0 to chip 1"),
              std::string::npos)
        << e.what();
  }
  CheckRoutes(pair, 1, {1});  // one rank: nothing to reach
  const Topology ring = RingTopology(4, "faults { from_chip: 0 to_chip: 1 down: true }");
  CheckRoutes(ring, 1, {4});  // routed around
}

// Routes are made on first use from a chip: threads asking at once for
// routes from the same chips get what one thread gets.
TEST(FabricGraph, RoutesFromManyThreadsAreTheSequentialOnes) {
  const Topology topo = Topology::Default();
  const FabricGraph sequential(topo, 2), shared(topo, 2);
  const int n = sequential.num_chips();
  std::vector<std::vector<std::vector<int>>> expected(n, std::vector<std::vector<int>>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) expected[a][b] = sequential.Route(a, b);
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < n * n; ++i) {
        const int a = (i + t * 7) % n, b = (i / n + t) % n;  // each thread its own order
        if (shared.Route(a, b) != expected[a][b]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  EXPECT_EQ(expected[0][17].size(), 2u);  // chip 0 -> NIC -> chip 17 of the other node
}

TEST(FabricModel, FaultOnAMissingLinkIsRejected) {
  const Topology topo = RingTopology(8, "faults { from_chip: 0 to_chip: 4 slowdown: 2 }");
  EXPECT_THROW(FabricModel(topo, PlaceRanks(topo, {8})), InvalidUsage);
}

TEST(FabricModel, RanksOnOneChipUseTheOnChipLink) {
  const Topology topo = Topology::FromText(
      "chips_per_node: 2 torus_dims: [2] ranks_per_chip: 2 "
      "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "inter_node_link { bandwidth_gbps: 100 latency_us: 2 } "
      "on_chip_link { bandwidth_gbps: 1000 latency_us: 1 }",
      "lnc-test");
  const FabricModel model(topo, PlaceRanks(topo, {4}));
  const Schedule s{"test", {Step{{{0, 1, 1e9}}}}};
  EXPECT_NEAR(ToSeconds(model.Simulate(s).total), 1e-6 + 1e9 / 1e12, 1e-12);
}

TEST(FabricModel, HierarchicalAllReduceMovesTheRightVolume) {
  // Per rank, hierarchical allreduce moves 2(l-1)/l S inside the node and
  // 2(N-1)/(N l) S across nodes: check the schedule's byte count.
  const Topology topo = Topology::Default();
  const FabricModel model(topo, PlaceRanks(topo, {4, 4}));
  const double s = 1 << 20;
  const auto sched = BuildSchedule(model, {CollectiveKind::kAllReduce, s, AllRanks(8), 0},
                                   FabricAlgorithm::kHierarchical);
  double per_rank = 0;
  for (const auto& step : sched.steps) {
    for (const auto& t : step.transfers) per_rank += t.src == 0 ? t.bytes * step.repeat : 0;
  }
  EXPECT_NEAR(per_rank, 2.0 * 3 / 4 * s + 2.0 * 1 / 8 * s, 1e-6);
  // Four chips on a row of each node's torus: rings of 4, then the nodes.
  EXPECT_EQ(StepCount(sched), 3u + 1u + 1u + 3u);
  EXPECT_EQ(sched.steps.size(), 4u);  // each ring's steps: one entry, repeated
  ASSERT_EQ(sched.stages.size(), 4u);
  EXPECT_EQ(sched.stages[0].name, "reduce-scatter over torus dim 1");
  EXPECT_EQ(sched.stages[1].name, "reduce-scatter over nodes");
}

TEST(FabricModel, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CollectiveKind::kBroadcast, 8), 1.0);
}

TEST(FabricModel, TreeBroadcastTakesLogSteps) {
  const Topology topo = SwitchTopology();
  const FabricModel model(topo, PlaceRanks(topo, std::vector<std::uint32_t>(8, 1)));
  const double s = 1 << 20;
  const CollectiveShape shape{CollectiveKind::kBroadcast, s, AllRanks(8), 3};
  const auto sched = BuildSchedule(model, shape, FabricAlgorithm::kTree);
  EXPECT_EQ(sched.steps.size(), 3u);
  EXPECT_EQ(sched.steps[0].transfers[0].src, 3);  // the root sends first
  ExpectClose(ToSeconds(model.Simulate(sched).total), 3 * (kA + s / kB), "binomial broadcast");
}

}  // namespace
}  // namespace neuron::runtime
