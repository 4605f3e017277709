// The NeuronCore device spec and the engines' cost model: the default spec
// carries the published figures; the cost model equals the published
// closed forms.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

std::string Message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidUsage& e) {
    return e.what();
  }
  return "no error";
}

TEST(DeviceSpec, TheDefaultIsANeuronCoreV3WithThePublishedFigures) {
  const DeviceSpec core = DeviceSpec::Default();
  EXPECT_EQ(core.spec().name(), "neuroncore-v3");
  EXPECT_NEAR(core.PeakTflops(false), 78.6, 0.1);  // "79 BF16 TFLOPS per core"
  EXPECT_NEAR(core.PeakTflops(true), 19.7, 0.1);   // "FP32 20"
  EXPECT_EQ(core.SbufBytes(), 28u << 20);          // 128 x 224 KiB
  EXPECT_EQ(core.PsumBytes(), 2u << 20);           // 128 x 16 KiB
  EXPECT_EQ(core.HbmBytes(), 12ull << 30);         // 96 GiB / 8 cores
  // The file in configs/ is the embedded one.
  const DeviceSpec file = DeviceSpec::FromFile(
      std::string(NEURON_SOURCE_DIR) + "/configs/devices/neuroncore-v3.textproto");
  EXPECT_EQ(file.spec().SerializeAsString(), core.spec().SerializeAsString());
}

TEST(DeviceSpec, NeuronCoreV2IsTrainiumsCore) {
  const DeviceSpec core = DeviceSpec::FromFile(
      std::string(NEURON_SOURCE_DIR) + "/configs/devices/neuroncore-v2.textproto");
  EXPECT_EQ(core.spec().name(), "neuroncore-v2");
  EXPECT_NEAR(core.PeakTflops(false), 91.75, 0.01);  // "over 90"; two per chip: 183.5 ("190")
  EXPECT_NEAR(core.PeakTflops(true), 22.9, 0.1);
  EXPECT_EQ(core.SbufBytes(), 24u << 20);
  EXPECT_EQ(core.HbmBytes(), 16ull << 30);           // 32 GiB / 2 cores
}

TEST(DeviceSpec, BadSpecsAreRefusedNamingFileAndField) {
  proto::DeviceSpec good = DeviceSpec::Default().spec();
  auto with = [&](auto change) {
    proto::DeviceSpec s = good;
    change(s);
    std::string text;
    google::protobuf::TextFormat::PrintToString(s, &text);
    return Message([&] { DeviceSpec::FromText(text, "bad.textproto"); });
  };
  EXPECT_NE(with([](auto& s) {
              s.mutable_tensor()->set_clock_ghz(0);
            }).find("bad.textproto: tensor.clock_ghz must be > 0 and finite, got 0"),
            std::string::npos);
  EXPECT_NE(with([](auto& s) {
              s.mutable_sbuf()->set_partitions(64);
            }).find("sbuf.partitions (64) must equal tensor.pe_rows (128)"),
            std::string::npos);
  EXPECT_NE(with([](auto& s) {
              s.mutable_hbm()->set_capacity_bytes(1024);
            }).find("must be smaller than HBM"),
            std::string::npos);
  EXPECT_NE(with([](auto& s) { s.mutable_vector()->set_lanes(0); }).find("vector needs"),
            std::string::npos);
  EXPECT_NE(with([](auto& s) {
              s.mutable_tensor()->set_fp32_slowdown(0.5);
            }).find("tensor.fp32_slowdown must be >= 1"),
            std::string::npos);
  const std::string parse = Message(
      [] { DeviceSpec::FromText("tensor {\n  clock_ghz: fast\n}\n", "typo.textproto"); });
  EXPECT_NE(parse.find("device spec typo.textproto: line 2, column"), std::string::npos)
      << parse;
  EXPECT_NE(Message([] {
              DeviceSpec::FromFile("/nonexistent/core.textproto");
            }).find("cannot read device spec file /nonexistent/core.textproto"),
            std::string::npos);
}

TEST(CostModel, MatmulCyclesFollowTheIssueIntervalModel) {
  const CostModel model(DeviceSpec::Default());
  // One full tile: 128x128 stationary, 512 moving columns: 512 cycles.
  MatmulCost one = model.Matmul(128, 128, 512, false);
  EXPECT_EQ(one.instructions, 1u);
  EXPECT_EQ(one.cycles, 512u);
  EXPECT_NEAR(one.time.count(), 512 / 2.4e3, 1e-9);
  EXPECT_NEAR(model.Mfu(one.flops, one.time, false), 1.0,
              1e-9);  // a full tile runs at peak
  // Narrow moving tiles still cost the 64-cycle minimum issue interval.
  EXPECT_EQ(model.Matmul(128, 128, 32, false).cycles, 64u);
  EXPECT_EQ(model.Matmul(128, 128, 100, false).cycles, 100u);
  // FP32 is 4x slower.
  EXPECT_EQ(model.Matmul(128, 128, 512, true).cycles, 2048u);
  // Tiling: K=300 -> 3 contraction tiles, M=200 -> 2 stationary tiles,
  // N=1100 -> moving tiles of 512, 512 and 76 columns (76 > the 64 minimum).
  MatmulCost tiled = model.Matmul(200, 300, 1100, false);
  EXPECT_EQ(tiled.instructions, 3u * 2u * 3u);
  EXPECT_EQ(tiled.cycles, 3u * 2u * (512u + 512u + 76u));
  EXPECT_DOUBLE_EQ(tiled.flops, 2.0 * 200 * 300 * 1100);
  // Partial tiles waste the array: utilisation below 1.
  EXPECT_LT(model.Mfu(tiled.flops, tiled.time, false), 1.0);
  EXPECT_EQ(model.Matmul(0, 128, 128, false).cycles, 0u);
}

TEST(CostModel, ElementwiseDmaAndHbmFollowTheirClosedForms) {
  const CostModel model(DeviceSpec::Default());
  // ~N cycles per input over N free elements per partition, +100 if dependent.
  EXPECT_EQ(model.ElementwiseCycles(Engine::kVector, 128 * 1000, 1, false), 1000u);
  EXPECT_EQ(model.ElementwiseCycles(Engine::kVector, 128 * 1000, 2, true), 2100u);
  EXPECT_EQ(model.ElementwiseCycles(Engine::kScalar, 129, 1, false), 2u);
  EXPECT_NEAR(model.Elementwise(Engine::kVector, 128 * 960, 1, false).count(), 1.0, 1e-9);
  EXPECT_NEAR(model.Elementwise(Engine::kScalar, 128 * 1200, 1, false).count(), 1.0,
              1e-9);
  // DMA: 1.3 us + bytes / 368 GB/s at >= 4 KiB per partition.
  EXPECT_NEAR(model.Dma(128 * 4096, 128).count(), 1.3 + 128 * 4096 / 368e3, 1e-9);
  // Smaller pieces per partition reach proportionally less bandwidth.
  EXPECT_NEAR(model.Dma(128 * 1024, 128).count(), 1.3 + 128 * 1024 / (368e3 / 4), 1e-9);
  EXPECT_NEAR(model.Dma(0, 128).count(), 1.3, 1e-12);
  EXPECT_NEAR(model.Hbm(362500000).count(), 1000.0, 1e-6);  // 362.5 MB at 362.5 GB/s
  EXPECT_THROW(model.ElementwiseCycles(Engine::kTensor, 10, 1, false), InvalidUsage);
}

TEST(CostModel, AScanWalksEachLineInOrderWithTheLinesSpreadOverTheLanes) {
  const CostModel model(DeviceSpec::Default());  // vector engine: 960 cycles per us
  // 128 lines of 960: one per lane, 960 cycles; as the elementwise pass.
  EXPECT_NEAR(model.Scan(Engine::kVector, 128, 960, false).count(), 1.0, 1e-9);
  EXPECT_NEAR(model.Elementwise(Engine::kVector, 128 * 960, 1, false).count(), 1.0, 1e-9);
  // One line of 960 does not spread: 960 cycles, where an elementwise pass
  // over its elements takes 8.
  EXPECT_NEAR(model.Scan(Engine::kVector, 1, 960, false).count(), 1.0, 1e-9);
  // 129 lines: two rounds; a dependent scan waits the engine's 100 cycles.
  EXPECT_NEAR(model.Scan(Engine::kVector, 129, 960, false).count(), 2.0, 1e-9);
  EXPECT_NEAR(model.Scan(Engine::kVector, 128, 860, true).count(), 1.0, 1e-9);
  EXPECT_EQ(model.Scan(Engine::kVector, 0, 960, false).count(), 0.0);
  EXPECT_THROW(model.Scan(Engine::kVector, -1, 960, false), InvalidUsage);
}

}  // namespace
}  // namespace neuron::runtime

#include "neuron/runtime/device/memory_counters.h"

namespace neuron::runtime {
namespace {

TEST(MemoryCounters, KeepReservedAllocatedActiveOrderedWithPeaksPerPhase) {
  MemoryCounters mem;
  mem.SetPhase("load");
  mem.Reserve(100);
  mem.Allocate(60);
  mem.SetPhase("step");
  mem.Activate(40);
  mem.Allocate(30);
  mem.Deactivate(40);
  mem.Free(50);
  MemorySnapshot s = mem.Snapshot();
  EXPECT_EQ(s.phase, "step");
  EXPECT_EQ(s.current.reserved, 100u);
  EXPECT_EQ(s.current.allocated, 40u);
  EXPECT_EQ(s.current.active, 0u);
  EXPECT_EQ(s.peak.allocated, 90u);
  EXPECT_EQ(s.phases["load"].allocated, 60u);
  EXPECT_EQ(s.phases["load"].active, 0u);
  EXPECT_EQ(s.phases["step"].allocated, 90u);
  EXPECT_EQ(s.phases["step"].active, 40u);
  // The order is an invariant: every breach is refused, naming the amounts.
  try {
    mem.Allocate(61);
    ADD_FAILURE();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "allocate would leave 101 bytes allocated in 100 reserved"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(mem.Activate(41), InvalidUsage);
  EXPECT_THROW(mem.Release(61), InvalidUsage);  // 40 still allocated
  try {
    mem.Free(41);
    ADD_FAILURE();
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("free 41 bytes but only 40 are allocated"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(mem.Snapshot().current.allocated, 40u);  // refused changes change nothing
  mem.ResetPeaks();
  EXPECT_EQ(mem.Snapshot().peak.allocated, 40u);
}

}  // namespace
}  // namespace neuron::runtime
