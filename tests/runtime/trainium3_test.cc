// Trainium3: the NeuronCore-v4 device specs and the trn3 topologies give
// Neuron's published figures (configs/devices/neuroncore-v4*.textproto,
// configs/topologies/trn3-*.textproto, their comments citing the pages),
// and the fabric model runs them: every chip one switch port from every
// other, a ring and a mesh at the port's closed forms.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "neuron/runtime/error.h"
#include "neuron/runtime/fabric/fabric_graph.h"
#include "neuron/runtime/fabric/hierarchy_levels.h"
#include "fabric_closed_forms.h"

namespace neuron::runtime {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::string Config(const std::string& dir, const std::string& name) {
  return std::string(NEURON_SOURCE_DIR) + "/configs/" + dir + "/" + name + ".textproto";
}

std::string ErrorOf(const std::string& topology_text) {
  try {
    Topology::FromText(topology_text, "t");
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "";
}

TEST(Trainium3, NeuronCoreV4HasThePublishedFigures) {
  const DeviceSpec v4 = DeviceSpec::FromFile(Config("devices", "neuroncore-v4"));
  EXPECT_EQ(v4.spec().name(), "neuroncore-v4");
  // "79 BF16/FP16/TF32 and 20 FP32 TFLOPS" per core (neuron-core-v4.rst).
  EXPECT_NEAR(v4.PeakTflops(false), 79, 0.5);
  EXPECT_NEAR(v4.PeakTflops(true), 20, 0.5);
  EXPECT_EQ(v4.SbufBytes(), 32 * kMiB);  // 32 MiB SBUF
  EXPECT_EQ(v4.PsumBytes(), 2 * kMiB);   // PSUM unchanged
  // The chip's 144 GiB at 4.9 TB/s and 4.9 TB/s of DMA, over its 8 cores.
  EXPECT_EQ(8 * v4.spec().hbm().capacity_bytes(), 144 * kGiB);
  EXPECT_DOUBLE_EQ(8 * v4.spec().hbm().bandwidth_gbps(), 4900);
  const auto& dma = v4.spec().dma();
  EXPECT_NEAR(8 * dma.engines() * dma.bandwidth_gbps_per_engine(), 4900, 20);
  EXPECT_EQ(dma.collective_compute_fraction(), 1);  // no longer half a copy's rate
  // Against NeuronCore-v3 (the default): the same BF16 peak, more of the rest.
  const DeviceSpec v3 = DeviceSpec::Default();
  EXPECT_DOUBLE_EQ(v4.PeakTflops(false), v3.PeakTflops(false));
  EXPECT_EQ(v4.spec().hbm().capacity_bytes() * 2, v3.spec().hbm().capacity_bytes() * 3);
}

TEST(Trainium3, Lnc2CoreIsTwoV4Cores) {
  const DeviceSpec v4 = DeviceSpec::FromFile(Config("devices", "neuroncore-v4"));
  const DeviceSpec lnc2 = DeviceSpec::FromFile(Config("devices", "neuroncore-v4-lnc2"));
  EXPECT_EQ(lnc2.spec().name(), "neuroncore-v4-lnc2");
  EXPECT_DOUBLE_EQ(lnc2.PeakTflops(false), 2 * v4.PeakTflops(false));
  EXPECT_EQ(lnc2.SbufBytes(), 2 * v4.SbufBytes());
  EXPECT_EQ(lnc2.PsumBytes(), 2 * v4.PsumBytes());
  EXPECT_EQ(lnc2.spec().hbm().capacity_bytes(), 2 * v4.spec().hbm().capacity_bytes());
  EXPECT_DOUBLE_EQ(lnc2.spec().hbm().bandwidth_gbps(), 2 * v4.spec().hbm().bandwidth_gbps());
  EXPECT_EQ(lnc2.spec().dma().engines(), 2 * v4.spec().dma().engines());
  EXPECT_EQ(lnc2.spec().vector().lanes(), 2 * v4.spec().vector().lanes());
}

TEST(Trainium3, ReductionRunsAtACopysRateOrTheHbmRate) {
  // v4: DMA 16 x 38.4 GB/s at full rate = 614.4 GB/s per core; HBM 612.5
  // GB/s per core over 3 bytes moved per byte reduced = 204.2 GB/s.
  const DeviceSpec v4 = DeviceSpec::FromFile(Config("devices", "neuroncore-v4"));
  EXPECT_DOUBLE_EQ(ReductionBytesPerSecond(v4, 1), 612.5e9 / 3);
  proto::DeviceSpec fast_hbm = v4.spec();
  fast_hbm.mutable_hbm()->set_bandwidth_gbps(4000);
  std::string text;
  google::protobuf::TextFormat::PrintToString(fast_hbm, &text);
  EXPECT_DOUBLE_EQ(ReductionBytesPerSecond(DeviceSpec::FromText(text, "fast-hbm"), 2),
                   2 * 16 * 38.4e9);
}

TEST(Trainium3, TopologiesLoadWithThePublishedShape) {
  for (const char* name :
       {"trn3-node", "trn3-node-lnc2", "trn3-ultraserver", "trn3-ultraserver-lnc2"}) {
    const Topology t = Topology::FromFile(Config("topologies", name));
    EXPECT_EQ(t.spec().name(), name);
    EXPECT_EQ(t.spec().chips_per_node(), 16u) << name;  // 16 Trainium3 per server
    EXPECT_EQ(t.spec().intra_node(), proto::TopologySpec::SWITCH) << name;
    // NeuronLink-v4: 2,048 GiB/s per device (trn3-arch.rst).
    EXPECT_NEAR(t.spec().intra_node_link().bandwidth_gbps() * 1e9, 2048.0 * kGiB, 1e7) << name;
    EXPECT_EQ(t.CoresPerChip(), 8u) << name;
    EXPECT_DOUBLE_EQ(t.spec().on_chip_link().bandwidth_gbps(), 4900) << name;
    // No Trn3 nccom-test run is published: trn2's calibration, assumed.
    EXPECT_EQ(t.spec().collective_engine().SerializeAsString(),
              Topology::Default().spec().collective_engine().SerializeAsString())
        << name;
  }
  const Topology us = Topology::FromFile(Config("topologies", "trn3-ultraserver"));
  EXPECT_EQ(us.spec().num_nodes() * us.spec().chips_per_node(), 64u);  // Gen1: 64 chips
  const Topology node = Topology::FromFile(Config("topologies", "trn3-node"));
  EXPECT_DOUBLE_EQ(node.spec().inter_node_link().bandwidth_gbps(), 25);  // 200 Gb/s per chip
  EXPECT_EQ(Topology::FromFile(Config("topologies", "trn3-node-lnc2")).spec().ranks_per_chip(),
            4u);
}

TEST(Trainium3, EveryChipIsOneSwitchPortFromEveryOther) {
  const Topology node = Topology::FromFile(Config("topologies", "trn3-node"));
  const FabricGraph two_nodes(node, 2);
  for (int to = 1; to < 16; ++to) {
    const auto route = two_nodes.Route(0, to);
    ASSERT_EQ(route.size(), 2u) << to;  // chip -> switch -> chip
    EXPECT_DOUBLE_EQ(ToSeconds(two_nodes.link(route[0]).latency +
                               two_nodes.link(route[1]).latency),
                     1.5e-6);
  }
  // Across nodes: the NICs and the EFA switch, not the NeuronSwitch.
  const auto across = two_nodes.Route(3, 20);
  ASSERT_EQ(across.size(), 2u);
  EXPECT_EQ(two_nodes.link(across[0]).name, "chip 3 NIC out");
  // The UltraServer: one switch for all 64 chips.
  const FabricGraph us(Topology::FromFile(Config("topologies", "trn3-ultraserver")), 4);
  EXPECT_EQ(us.num_chips(), 64);
  const auto far = us.Route(0, 63);
  ASSERT_EQ(far.size(), 2u);
  EXPECT_EQ(us.link(far[0]).name, "chip 0 switch port out");
  EXPECT_EQ(us.link(far[1]).name, "chip 63 switch port in");
}

TEST(Trainium3, RingAndMeshRunAtTheSwitchPortsClosedForms) {
  const Topology topo =
      Uncalibrated(Topology::FromFile(Config("topologies", "trn3-node")));
  const FabricModel model(topo, PlaceRanks(topo, {16}));
  const double a = 1.5e-6, b = 2199.02e9, s = 64 << 20;
  // A ring uses each port once a step, whatever the order.
  ExpectClose(Seconds(model, CollectiveKind::kAllReduce, s, FabricAlgorithm::kRing),
              15 * (ReduceHop(s / 16, a, b) + Hop(s / 16, a, b)), "trn3 ring allreduce");
  // A mesh allgather sends 15 shares out of each port and into each at once.
  ExpectClose(Seconds(model, CollectiveKind::kAllGather, s, FabricAlgorithm::kMesh),
              a + 15 * (s / 16) / b, "trn3 mesh allgather");
}

TEST(Trainium3, HierarchyHasOneSwitchLevelPerNode) {
  const Topology topo = Topology::FromFile(Config("topologies", "trn3-node"));
  const FabricModel model(topo, PlaceRanks(topo, {16, 16}));
  const auto levels = HierarchyLevels(model, AllRanks(32));
  ASSERT_TRUE(levels.has_value());
  ASSERT_EQ(levels->size(), 2u);
  EXPECT_EQ((*levels)[0].name, "switch");
  EXPECT_EQ((*levels)[0].groups.size(), 2u);
  EXPECT_EQ((*levels)[1].name, "nodes");
}

TEST(Trainium3, SwitchedTopologiesRefuseTorusFieldsAndMissingLinks) {
  const std::string port = " intra_node_link { bandwidth_gbps: 1 } ranks_per_chip: 1";
  EXPECT_NE(ErrorOf("chips_per_node: 4 intra_node: SWITCH torus_dims: [4]"
                    " inter_node_link { bandwidth_gbps: 1 }" + port)
                .find("torus_dims must be empty with intra_node: SWITCH"),
            std::string::npos);
  EXPECT_NE(ErrorOf("chips_per_node: 4 intra_node: SWITCH inter_node: NEURONLINK"
                    " inter_node_link { bandwidth_gbps: 1 }" + port)
                .find("leave inter_node_link out"),
            std::string::npos);
  EXPECT_NE(ErrorOf("chips_per_node: 4 intra_node: SWITCH" + port)
                .find("inter_node_link.bandwidth_gbps"),
            std::string::npos);  // EFA between nodes still needs its NIC
  EXPECT_EQ(ErrorOf("chips_per_node: 4 intra_node: SWITCH inter_node: NEURONLINK" + port), "");
  // A NIC fault with no EFA in the job names no link (not a switch port).
  const Topology faulty = Topology::FromText(
      "chips_per_node: 4 intra_node: SWITCH inter_node_link { bandwidth_gbps: 1 }" + port +
          " faults { from_chip: 1 to_chip: -1 down: true }",
      "t");
  try {
    FabricGraph(faulty, 1);
    ADD_FAILURE() << "a NIC fault on a one-node job was accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("fault names a link that does not exist: chip 1 -> NIC"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace neuron::runtime
