#include "neuron/runtime/topology.h"

#include <gtest/gtest.h>

#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "";
}

TEST(Topology, DefaultIsOneTrn2Node) {
  const Topology t = Topology::Default();
  EXPECT_EQ(t.spec().name(), "trn2-node");
  EXPECT_EQ(t.spec().chips_per_node(), 16u);
  ASSERT_EQ(t.spec().torus_dims_size(), 2);
  EXPECT_EQ(t.spec().torus_dims(0) * t.spec().torus_dims(1), 16u);
  EXPECT_DOUBLE_EQ(t.spec().intra_node_link().bandwidth_gbps(), 256);
  EXPECT_EQ(t.spec().ranks_per_chip(), 1u);
}

TEST(Topology, ShippedConfigsLoad) {
  for (const char* name :
       {"trn2-node", "trn2-node-lnc2", "trn2-ultraserver", "trn1-node", "trn1n-node"}) {
    const Topology t = Topology::FromFile(std::string(NEURON_SOURCE_DIR) +
                                          "/configs/topologies/" + name + ".textproto");
    EXPECT_EQ(t.spec().name(), name);
  }
}

TEST(Topology, ParseErrorNamesFileLineAndColumn) {
  const std::string e = ErrorOf([] {
    Topology::FromText("name: \"x\"\nchips_per_node: 16\nbogus_field: 3\n", "my.textproto");
  });
  EXPECT_NE(e.find("my.textproto"), std::string::npos) << e;
  EXPECT_NE(e.find("line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("bogus_field"), std::string::npos) << e;
}

TEST(Topology, ImpossibleValuesAreRejected) {
  const std::string base =
      "chips_per_node: 16 intra_node_link { bandwidth_gbps: 1 } "
      "inter_node_link { bandwidth_gbps: 1 } ranks_per_chip: 1 ";
  EXPECT_NE(ErrorOf([&] { Topology::FromText(base + "torus_dims: [4, 3]", "t"); })
                .find("multiply to 12"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              Topology::FromText(
                  "chips_per_node: 4 torus_dims: [4] ranks_per_chip: 9 "
                  "intra_node_link { bandwidth_gbps: 1 } inter_node_link { bandwidth_gbps: 1 }",
                  "t");
            }).find("ranks_per_chip must be 1..8"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Topology::FromText("chips_per_node: 4 torus_dims: [4] ranks_per_chip: 1 "
                                 "intra_node_link { bandwidth_gbps: 0 }",
                                 "t");
            }).find("intra_node_link.bandwidth_gbps"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { Topology::FromFile("/nonexistent/topo.textproto"); })
                .find("cannot read topology file /nonexistent/topo.textproto"),
            std::string::npos);
}

TEST(Topology, AbsurdSizesAndNonFiniteFiguresAreRejectedNamingTheField) {
  const std::string links =
      " intra_node_link { bandwidth_gbps: 1 } inter_node_link { bandwidth_gbps: 1 }"
      " ranks_per_chip: 1";
  auto error = [&](const std::string& text) { return ErrorOf([&] { Topology::FromText(text, "t"); }); };
  EXPECT_NE(error("chips_per_node: 1000000 torus_dims: [1000, 1000]" + links)
                .find("chips_per_node must be 1 to 4096, got 1000000"),
            std::string::npos);
  EXPECT_NE(error("chips_per_node: 16 torus_dims: [4, 4]"
                  " intra_node_link { bandwidth_gbps: 1 latency_us: 1e308 }"
                  " inter_node_link { bandwidth_gbps: 1 } ranks_per_chip: 1")
                .find("intra_node_link.latency_us must be 0 to 1e+06 us, got 1e+308"),
            std::string::npos);
  EXPECT_NE(error("chips_per_node: 16 torus_dims: [4, 4]"
                  " intra_node_link { bandwidth_gbps: 1e-300 }"
                  " inter_node_link { bandwidth_gbps: 1 } ranks_per_chip: 1")
                .find("intra_node_link.bandwidth_gbps must be 0.001 to 1e+06 GB/s"),
            std::string::npos);
  EXPECT_NE(error("chips_per_node: 16 torus_dims: [4, 4]"
                  " intra_node_link { bandwidth_gbps: nan }"
                  " inter_node_link { bandwidth_gbps: 1 } ranks_per_chip: 1")
                .find("intra_node_link.bandwidth_gbps"),
            std::string::npos);
  EXPECT_NE(error("chips_per_node: 16 torus_dims: [4, 4]" + links +
                  " rank_delays { rank: 0 delay_us: inf }")
                .find("rank_delays needs rank >= 0 and delay_us 0 to"),
            std::string::npos);
  EXPECT_NE(error("chips_per_node: 16 torus_dims: [4, 4]" + links + " num_nodes: 70000")
                .find("num_nodes must be 0 to 65536"),
            std::string::npos);
}

TEST(Topology, PlacementFillsChipsInOrder) {
  const Topology t = Topology::FromFile(std::string(NEURON_SOURCE_DIR) +
                                        "/configs/topologies/trn2-node-lnc2.textproto");
  EXPECT_EQ(t.Place(0, 0).chip, 0u);
  EXPECT_EQ(t.Place(0, 3).chip, 0u);
  EXPECT_EQ(t.Place(0, 3).core, 3u);
  EXPECT_EQ(t.Place(0, 4).chip, 1u);
  EXPECT_EQ(t.Place(1, 5).chip, 17u);
  EXPECT_EQ(t.Place(1, 5).node, 1u);
}

TEST(Topology, JobsThatDoNotFitAreRejected) {
  const Topology t = Topology::Default();
  EXPECT_NO_THROW(t.CheckFits(4, {16, 16, 16, 16}));
  EXPECT_NE(ErrorOf([&] { t.CheckFits(1, {17}); }).find("node 0 has 17 ranks"),
            std::string::npos);
  const Topology us = Topology::FromFile(std::string(NEURON_SOURCE_DIR) +
                                         "/configs/topologies/trn2-ultraserver.textproto");
  EXPECT_NE(ErrorOf([&] { us.CheckFits(5, {1, 1, 1, 1, 1}); })
                .find("has 4 nodes but the job has 5"),
            std::string::npos);
}

}  // namespace
}  // namespace neuron::runtime
