// The fabric model's chunked pipelines, N-level hierarchies, all-to-all,
// one-way faults and algorithm choice, against closed forms: one chunk is
// the alpha-beta sum of its steps; k chunks through s stages on disjoint
// links take the first chunk's time through every stage plus (k - 1) times
// the slowest stage's chunk time.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "fabric_closed_forms.h"
#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/collective_cost.h"
#include "neuron/runtime/fabric/fabric_graph.h"

namespace neuron::runtime {
namespace {

// Two trn2 nodes (4x4 torus each, EFA between them), 32 ranks, one per
// chip; the figures come from the topology so the closed forms follow it.
struct TwoTrn2Nodes {
  Topology topology = Uncalibrated(Topology::Default());
  FabricModel model{topology, PlaceRanks(topology, {16, 16})};
  double a = topology.spec().intra_node_link().latency_us() * 1e-6;
  double b = topology.spec().intra_node_link().bandwidth_gbps() * 1e9;
  double ae = topology.spec().inter_node_link().latency_us() * 1e-6;  // NIC out; in: 0
  double be = topology.spec().inter_node_link().bandwidth_gbps() * 1e9;
};

Schedule Build(const FabricModel& model, CollectiveKind kind, double bytes,
               FabricAlgorithm algorithm, int chunks) {
  Schedule s = BuildSchedule(model, {kind, bytes, AllRanks(model.world_size()), 0}, algorithm);
  s.chunks = chunks;
  return s;
}

double FlowShop(const std::vector<double>& stages, int k) {
  double sum = 0, slowest = 0;
  for (double t : stages) {
    sum += t;
    slowest = std::max(slowest, t);
  }
  return sum + (k - 1) * slowest;
}

TEST(FabricPipeline, ThreeLevelAllReduceRunsOneRingPerDimension) {
  const TwoTrn2Nodes f;
  const double s = 64 << 20;
  const Schedule sched =
      Build(f.model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kHierarchical, 1);
  ASSERT_EQ(sched.stages.size(), 6u);
  const char* names[] = {"reduce-scatter over torus dim 1", "reduce-scatter over torus dim 0",
                         "reduce-scatter over nodes",       "allgather over nodes",
                         "allgather over torus dim 0",      "allgather over torus dim 1"};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(sched.stages[i].name, names[i]);
  // 3 + 3 steps per phase inside the node where one ring of 16 pays 15.
  EXPECT_EQ(StepCount(sched), 3u + 3u + 1u + 1u + 3u + 3u);
  const double expected = 3 * ReduceHop(s / 4, f.a, f.b) + 3 * ReduceHop(s / 16, f.a, f.b) +
                          ReduceHop(s / 32, f.ae, f.be) + Hop(s / 32, f.ae, f.be) +
                          3 * Hop(s / 16, f.a, f.b) + 3 * Hop(s / 4, f.a, f.b);
  ExpectClose(ToSeconds(f.model.Simulate(sched).total), expected, "three-level allreduce");
}

TEST(FabricPipeline, ChunkedReduceScatterMatchesTheFlowShopClosedForm) {
  // Stages on disjoint links (dim 1, dim 0, the NICs), each reducing.
  const TwoTrn2Nodes f;
  const double s = 256.0 * (1 << 20);
  for (int k : {1, 2, 8, 64}) {
    const double c = s / k;
    const std::vector<double> stages = {3 * ReduceHop(c / 4, f.a, f.b),
                                        3 * ReduceHop(c / 16, f.a, f.b),
                                        ReduceHop(c / 32, f.ae, f.be)};
    const Schedule sched =
        Build(f.model, CollectiveKind::kReduceScatter, s, FabricAlgorithm::kHierarchical, k);
    const SimulationResult r = f.model.Simulate(sched);
    ExpectClose(ToSeconds(r.total), FlowShop(stages, k), "reduce-scatter k=" + std::to_string(k));
    ASSERT_EQ(r.stages.size(), 3u);
    ExpectClose(ToSeconds(r.stages[2]), stages[2], "inter-node stage on one chunk");
  }
}

TEST(FabricPipeline, ChunkedAllGatherMatchesTheFlowShopClosedForm) {
  const TwoTrn2Nodes f;
  const double s = 64 << 20;
  for (int k : {1, 4, 16}) {
    const double c = s / k;
    const std::vector<double> stages = {Hop(c / 32, f.ae, f.be), 3 * Hop(c / 16, f.a, f.b),
                                        3 * Hop(c / 4, f.a, f.b)};
    ExpectClose(ToSeconds(f.model
                              .Simulate(Build(f.model, CollectiveKind::kAllGather, s,
                                              FabricAlgorithm::kHierarchical, k))
                              .total),
                FlowShop(stages, k), "allgather k=" + std::to_string(k));
  }
}

TEST(FabricPipeline, PipelinedAllReduceHidesTheInterNodeStage) {
  // The reduce-scatter and allgather over a dimension share its links, so
  // they take turns; the NIC stages overlap them.
  const TwoTrn2Nodes f;
  const double s = 256.0 * (1 << 20);
  const int k = 64;
  const auto one = f.model.Simulate(
      Build(f.model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kHierarchical, 1));
  const auto piped = f.model.Simulate(
      Build(f.model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kHierarchical, k));
  ASSERT_EQ(piped.stages.size(), 6u);
  // Per chunk, the busiest links: dim 1's, carrying stages 0 and 5.
  const double dim1 = (piped.stages[0] + piped.stages[5]).count();
  const double dim0 = (piped.stages[1] + piped.stages[4]).count();
  const double nics = (piped.stages[2] + piped.stages[3]).count();
  EXPECT_GE(piped.total.count(), k * std::max({dim1, dim0, nics}) * (1 - 1e-12));
  EXPECT_LT(piped.total.count(), one.total.count());
  // The NICs' work is hidden: the pipeline takes about what the intra-node
  // links need alone.
  EXPECT_LT(piped.total.count(), k * (dim1 + dim0) + nics + (piped.stages[0].count()));
}

TEST(FabricPipeline, ChunkCountIsTheFastestWithinTheEnginesBounds) {
  auto two_nodes = [](const std::string& engine) {
    return Topology::FromText("chips_per_node: 4 torus_dims: [4] ranks_per_chip: 1 "
                              "intra_node_link { bandwidth_gbps: 100 latency_us: 2 } "
                              "inter_node_link { bandwidth_gbps: 25 latency_us: 15 } " + engine,
                              "chunk-test");
  };
  const Topology topo = two_nodes("collective_engine { min_chunk_bytes: 1048576 max_chunks: 8 }");
  const FabricModel model(topo, PlaceRanks(topo, {4, 4}));
  for (double bytes : {512.0 * 1024, 4.0 * (1 << 20), 64.0 * (1 << 20), 256.0 * (1 << 20)}) {
    const Schedule s = BuildSchedule(model, {CollectiveKind::kAllReduce, bytes, AllRanks(8), 0},
                                     FabricAlgorithm::kHierarchical);
    const double chosen = model.Simulate(s).total.count();
    EXPECT_LE(s.chunks, 8);
    if (s.chunks > 1) {
      EXPECT_GE(bytes / s.chunks, 1048576.0) << bytes;
    }
    for (int k = 1; k <= 8 && bytes / k >= 1048576; k *= 2) {
      Schedule other = s;
      other.chunks = k;
      EXPECT_LE(chosen, model.Simulate(other).total.count()) << bytes << " B, " << k << " chunks";
    }
  }
  // Large buffers do pipeline: the NIC stage hides behind the torus stages.
  EXPECT_GT(BuildSchedule(model, {CollectiveKind::kAllReduce, 256 << 20, AllRanks(8), 0},
                          FabricAlgorithm::kHierarchical).chunks, 1);
  // One stage: nothing to pipeline.
  EXPECT_EQ(BuildSchedule(model, {CollectiveKind::kAllReduce, 256 << 20, AllRanks(8), 0},
                          FabricAlgorithm::kRing).chunks, 1);
  // No min_chunk_bytes: never chunked.
  const Topology whole = two_nodes("");
  const FabricModel unchunked(whole, PlaceRanks(whole, {4, 4}));
  EXPECT_EQ(BuildSchedule(unchunked, {CollectiveKind::kAllReduce, 256 << 20, AllRanks(8), 0},
                          FabricAlgorithm::kHierarchical).chunks, 1);
  EXPECT_THROW(two_nodes("collective_engine { max_chunks: 5000 }"), InvalidUsage);
}

TEST(FabricPipeline, RingAllToAllStoresAndForwards) {
  const int n = 8;
  const Topology topo = RingTopology(n);
  const FabricModel model(topo, PlaceRanks(topo, {static_cast<std::uint32_t>(n)}));
  const double s = 16 << 20, share = s / n;
  double expected = 0;
  for (int k = 1; k < n; ++k) expected += Hop((n - k) * share);
  ExpectClose(Seconds(model, CollectiveKind::kAllToAll, s, FabricAlgorithm::kRing), expected,
              "ring all-to-all");
}

TEST(FabricPipeline, OneWayFaultTakesOutOneDirection) {
  const Topology down =
      RingTopology(4, "faults { from_chip: 0 to_chip: 1 down: true one_way: true }");
  const FabricModel cut(down, PlaceRanks(down, {4}));
  EXPECT_EQ(cut.graph().Route(0, 1).size(), 3u);  // around: 0 -> 3 -> 2 -> 1
  EXPECT_EQ(cut.graph().Route(1, 0).size(), 1u);  // the other direction still works
  // A ring allgather runs 0 -> 1 -> 2 -> 3 -> 0: a one-way slowdown on 1 -> 2 slows it.
  const Topology slow =
      RingTopology(4, "faults { from_chip: 1 to_chip: 2 slowdown: 4 one_way: true }");
  const FabricModel model(slow, PlaceRanks(slow, {4}));
  const double s = 64 << 20;
  ExpectClose(Seconds(model, CollectiveKind::kAllGather, s, FabricAlgorithm::kRing),
              3 * Hop(s / 4, kA, kB / 4), "ring allgather over a one-way slow link");
  const Schedule back{"test", {Step{{{2, 1, s}}}}};
  ExpectClose(ToSeconds(model.Simulate(back).total), Hop(s), "2 -> 1 unaffected");
  // EFA: only the NIC's ingress of chip 0.
  const Topology efa =
      SwitchTopology("faults { from_chip: -1 to_chip: 0 slowdown: 2 one_way: true }");
  const FabricModel nics(efa, PlaceRanks(efa, {1, 1}));
  const Schedule in{"test", {Step{{{1, 0, s}}}}}, out{"test", {Step{{{0, 1, s}}}}};
  ExpectClose(ToSeconds(nics.Simulate(in).total), Hop(s, kA, kB / 2), "into chip 0");
  ExpectClose(ToSeconds(nics.Simulate(out).total), Hop(s), "out of chip 0");
  const Topology egress =
      SwitchTopology("faults { from_chip: 0 to_chip: -1 slowdown: 2 one_way: true }");
  const FabricModel out_only(egress, PlaceRanks(egress, {1, 1}));
  ExpectClose(ToSeconds(out_only.Simulate(out).total), Hop(s, kA, kB / 2), "out of chip 0 slowed");
  ExpectClose(ToSeconds(out_only.Simulate(in).total), Hop(s), "into chip 0 unaffected");
  // No NICs between UltraServer nodes: a NIC fault there is refused.
  EXPECT_THROW(RingTopology(4, "inter_node: NEURONLINK "
                               "faults { from_chip: -1 to_chip: 0 down: true one_way: true }"),
               InvalidUsage);
  try {
    SwitchTopology("faults { from_chip: -1 to_chip: 0 slowdown: 2 }");
    FAIL() << "accepted from_chip -1 without one_way";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("fault on link -1->0 names a negative chip"),
              std::string::npos)
        << e.what();
  }
}

// Without calibrated rules, the automatic choice is the fastest.
TEST(FabricPipeline, AutoPicksTheFastestModelledAlgorithm) {
  const Topology topo = Uncalibrated(Topology::Default());
  const FabricModel node(topo, PlaceRanks(topo, {16}));
  const FabricModel two(topo, PlaceRanks(topo, {16, 16}));
  const FabricAlgorithm all[] = {FabricAlgorithm::kRing, FabricAlgorithm::kMesh,
                                 FabricAlgorithm::kRdh, FabricAlgorithm::kHierarchical,
                                 FabricAlgorithm::kTree};
  for (const FabricModel* m : {&node, &two}) {
    for (auto kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                      CollectiveKind::kReduceScatter, CollectiveKind::kBroadcast,
                      CollectiveKind::kAllToAll}) {
      for (double bytes : {4096.0, 1048576.0, 16777216.0, 268435456.0}) {
        const CollectiveShape shape{kind, bytes, AllRanks(m->world_size()), 0};
        const FabricAlgorithm chosen = ChooseAlgorithm(*m, shape);
        const double chosen_us = m->Simulate(BuildSchedule(*m, shape, chosen)).total.count();
        for (FabricAlgorithm a : all) {
          if (!Implements(*m, a, shape)) continue;
          if (a == FabricAlgorithm::kHierarchical && m == &node) continue;  // not a candidate
          EXPECT_LE(chosen_us, m->Simulate(BuildSchedule(*m, shape, a)).total.count())
              << Name(kind) << " " << bytes << " B on " << m->world_size() << " ranks: "
              << Name(chosen) << " over " << Name(a);
        }
      }
    }
  }
  // The figures in docs/performance.md: inside a node mesh to 4 MiB, ring
  // from 16 MiB (rdh rated slower there); across nodes hierarchical.
  auto choice = [](const FabricModel& m, CollectiveKind k, double bytes) {
    return std::string(Name(ChooseAlgorithm(m, {k, bytes, AllRanks(m.world_size()), 0})));
  };
  EXPECT_EQ(choice(node, CollectiveKind::kAllReduce, 1 << 20), "mesh");
  EXPECT_EQ(choice(node, CollectiveKind::kAllReduce, 4 << 20), "mesh");
  EXPECT_EQ(choice(node, CollectiveKind::kAllReduce, 16 << 20), "ring");
  EXPECT_EQ(choice(node, CollectiveKind::kAllReduce, 256 << 20), "ring");
  EXPECT_EQ(choice(node, CollectiveKind::kAllToAll, 256 << 20), "mesh");
  EXPECT_EQ(choice(two, CollectiveKind::kAllReduce, 1 << 20), "hierarchical");
  EXPECT_EQ(choice(two, CollectiveKind::kAllReduce, 128 << 20), "hierarchical");
  const ChosenSchedule chosen =
      AutomaticSchedule(node, {CollectiveKind::kAllReduce, 16 << 20, AllRanks(16), 0});
  EXPECT_NEAR(chosen.micros, 176.02, 0.01);  // docs/performance.md's table
}

// Implements is exactly "BuildSchedule does not throw".
TEST(FabricPipeline, ImplementsSaysWhatBuildScheduleRuns) {
  const Topology topo = Topology::Default();
  const FabricModel two(topo, PlaceRanks(topo, {16, 16}));
  for (auto a : {FabricAlgorithm::kRing, FabricAlgorithm::kMesh, FabricAlgorithm::kRdh,
                 FabricAlgorithm::kRecursiveDoubling, FabricAlgorithm::kHierarchical,
                 FabricAlgorithm::kTree}) {
    for (auto kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather,
                      CollectiveKind::kReduceScatter, CollectiveKind::kBroadcast,
                      CollectiveKind::kReduce, CollectiveKind::kAllToAll}) {
      for (const std::vector<int>& ranks :
           {AllRanks(6), AllRanks(8), AllRanks(32), std::vector<int>{0, 1, 2, 16, 17}}) {
        const CollectiveShape shape{kind, 1 << 20, ranks, 0};
        bool built = true;
        try {
          BuildSchedule(two, shape, a);
        } catch (const InvalidUsage&) {
          built = false;
        }
        EXPECT_EQ(Implements(two, a, shape), built)
            << Name(a) << " " << Name(kind) << " on " << ranks.size() << " ranks";
      }
    }
  }
  EXPECT_THROW(BuildSchedule(two, {CollectiveKind::kAllReduce, 1, AllRanks(6), 0},
                             FabricAlgorithm::kRdh),
               InvalidUsage);
}

// Hand-made stages: an empty stage passes chunks straight on; two stages
// on one link take turns; stages sharing no link overlap.
TEST(FabricPipeline, ConflictingAndEmptyStagesPipelineAsTheRulesSay) {
  const Topology topo = RingTopology(4);
  const FabricModel model(topo, PlaceRanks(topo, {4}));
  const double s = 64 << 20;
  Schedule sched("test", {Step{{{0, 1, s}}}, Step{{{2, 3, s}}}});
  sched.stages = {{"a", 0, 1}, {"empty", 1, 1}, {"b", 1, 2}};
  for (int k : {1, 4}) {
    sched.chunks = k;
    ExpectClose(ToSeconds(model.Simulate(sched).total), FlowShop({Hop(s / k), Hop(s / k)}, k),
                "disjoint links with an empty stage between, k=" + std::to_string(k));
  }
  Schedule same("test", {Step{{{0, 1, s}}}, Step{{{0, 1, s / 2}}}});
  same.chunks = 4;
  same.stages = {{"a", 0, 1}, {"b", 1, 2}};
  ExpectClose(ToSeconds(model.Simulate(same).total), 4 * (Hop(s / 4) + Hop(s / 8)),
              "two stages on one link take turns");
  Schedule bad = same;
  bad.stages = {{"a", 0, 1}};
  EXPECT_THROW(model.Simulate(bad), InvalidUsage);  // stages leave a step out
}

TEST(FabricPipeline, ForcedAlgorithmAppliesWhereItRuns) {
  const Topology topo = Topology::Default();
  const FabricModel node(topo, PlaceRanks(topo, {16}));
  EXPECT_STREQ(ModelCollective(node, "allreduce", 16 << 20, AllRanks(16), 0,
                               FabricAlgorithm::kRdh).algorithm,
               "rdh");
  EXPECT_STREQ(ModelCollective(node, "broadcast", 16 << 20, AllRanks(16), 0,
                               FabricAlgorithm::kRing).algorithm,
               "ring");
  // rdh cannot run 6 ranks: the automatic choice runs instead, and says so.
  const CollectiveShape six{CollectiveKind::kAllReduce, 16 << 20, AllRanks(6), 0};
  EXPECT_STREQ(ModelCollective(node, "allreduce", 16 << 20, AllRanks(6), 0,
                               FabricAlgorithm::kRdh).algorithm,
               Name(ChooseAlgorithm(node, six)));
  {
    const ScopedEnv mesh("NEURON_FABRIC_ALGO", "mesh");
    EXPECT_EQ(ConfiguredFabricAlgorithm(), FabricAlgorithm::kMesh);
  }
  {
    const ScopedEnv bad("NEURON_FABRIC_ALGO", "fastest");
    try {
      ConfiguredFabricAlgorithm();
      ADD_FAILURE() << "accepted NEURON_FABRIC_ALGO=fastest";
    } catch (const InvalidUsage& e) {
      EXPECT_NE(std::string(e.what()).find("NEURON_FABRIC_ALGO must be auto, ring"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(ConfiguredFabricAlgorithm(), FabricAlgorithm::kAuto);
}

}  // namespace
}  // namespace neuron::runtime
