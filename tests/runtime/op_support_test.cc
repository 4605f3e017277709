// The device's op support table (op_support.h) and the price of a CPU
// fallback (eager_cost.h).
#include "neuron/runtime/device/op_support.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "neuron/runtime/device/cost_model.h"
#include "neuron/runtime/device/device_spec.h"
#include "neuron/runtime/device/eager_cost.h"
#include "neuron/runtime/error.h"

namespace neuron::runtime {
namespace {

TEST(OpSupport, EachCategoryOnRealOps) {
  EXPECT_EQ(SupportOf("mm").support, Support::kNative);
  EXPECT_EQ(SupportOf("mm").kind, EagerKind::kMatmul);
  EXPECT_EQ(SupportOf("exp").kind, EagerKind::kScalar);
  EXPECT_EQ(SupportOf("cumsum").kind, EagerKind::kVector);  // the compiler's scan too
  for (const char* op : {"sort", "_unique2", "nonzero", "masked_select"}) {
    EXPECT_EQ(SupportOf(op).support, Support::kCpuFallback) << op;
    EXPECT_EQ(SupportOf(op).kind, EagerKind::kFallback) << op;
  }
  EXPECT_EQ(SupportOf("quantize_per_tensor").support, Support::kUnsupported);
  EXPECT_NE(std::string(SupportOf("_fft_r2c").note).find("NCC_EVRF004"), std::string::npos);
  EXPECT_EQ(SupportOf("view").support, Support::kHostOnly);
  EXPECT_EQ(SupportOf("view").kind, EagerKind::kView);
  // An op the table does not list falls back to the CPU.
  EXPECT_EQ(SupportOf("special_bessel_j0").support, Support::kCpuFallback);
  EXPECT_STREQ(SupportOf("special_bessel_j0").op, "");
}

TEST(OpSupport, BaseNamesAreUniqueAndRowsConsistent) {
  std::set<std::string> seen;
  for (const OpSupport& row : OpSupportTable()) {
    EXPECT_TRUE(seen.insert(row.op).second) << row.op << " is listed twice";
    EXPECT_EQ(&SupportOf(row.op), &row);
    EXPECT_NE(std::string(row.note), "") << row.op;
    const bool fallback_kind = row.kind == EagerKind::kFallback;
    EXPECT_EQ(fallback_kind, row.support == Support::kCpuFallback ||
                                 row.support == Support::kUnsupported)
        << row.op;
    EXPECT_EQ(row.kind == EagerKind::kView, row.support == Support::kHostOnly) << row.op;
  }
}

TEST(OpSupport, TypesTheCoreLacks) {
  EXPECT_EQ(SupportOfType("Float"), TypeSupport::kNative);
  EXPECT_EQ(SupportOfType("BFloat16"), TypeSupport::kNative);
  EXPECT_EQ(SupportOfType("Long"), TypeSupport::kNative);
  EXPECT_EQ(SupportOfType("Double"), TypeSupport::kCpuFallback);
  EXPECT_EQ(SupportOfType("ComplexFloat"), TypeSupport::kUnsupported);
  EXPECT_EQ(SupportOfType("ComplexDouble"), TypeSupport::kUnsupported);
  EXPECT_NE(std::string(TypeUnsupportedReason("ComplexFloat")).find("NCC_EVRF004"),
            std::string::npos);
  EXPECT_EQ(SupportOfType("Float8_e4m3fn"), TypeSupport::kNative);  // Trainium2's FP8
  EXPECT_EQ(SupportOfType("Float8_e5m2fnuz"), TypeSupport::kUnsupported);
  EXPECT_NE(std::string(TypeUnsupportedReason("Float8_e4m3fnuz")).find("NCC_EVRF005"),
            std::string::npos);
  EXPECT_STREQ(TypeUnsupportedReason("Float"), "");
}

// 1 MiB in, 1 MiB out over 256 Ki elements at the defaults: 32 GB/s and 2 us a
// copy, 1 ns an element on the CPU, 5 us of synchronisation.
TEST(FallbackCost, CopiesBothWaysTheCpuKernelAndTheSync) {
  const CostModel model(DeviceSpec::Default());
  EagerOp op;
  op.kind = EagerKind::kFallback;
  op.bytes_in = op.bytes_out = 1 << 20;
  op.elements = 1 << 18;
  const FallbackCost parts = FallbackParts(model.device(), op);
  const double copy = 2 + (1 << 20) / 32e3;
  EXPECT_DOUBLE_EQ(parts.to_host.count(), copy);
  EXPECT_DOUBLE_EQ(parts.to_device.count(), copy);
  EXPECT_DOUBLE_EQ(parts.cpu.count(), (1 << 18) / 1e3);
  EXPECT_DOUBLE_EQ(parts.sync.count(), 5);
  EXPECT_DOUBLE_EQ(EagerCost(model, op).count(), 2 * copy + (1 << 18) / 1e3 + 5);
  // The same op on the vector engine is far cheaper: the fallback is priced.
  op.kind = EagerKind::kVector;
  EXPECT_LT(EagerCost(model, op).count() * 4, parts.total().count());
}

TEST(FallbackCost, TheSpecsHostFiguresAreUsedAndChecked) {
  std::string text = DeviceSpec::Default().spec().DebugString();
  const DeviceSpec slow = DeviceSpec::FromText(
      text + "host { link_gbps: 1 link_latency_us: 10 sync_us: 20 cpu_ns_per_element: 2 }",
      "slow");
  EagerOp op;
  op.kind = EagerKind::kFallback;
  op.bytes_in = 1000;
  op.bytes_out = 2000;
  op.elements = 500;
  EXPECT_DOUBLE_EQ(EagerCost(CostModel(slow), op).count(), (10 + 1) + 1 + (10 + 2) + 20);
  try {
    DeviceSpec::FromText(text + "host { sync_us: -1 }", "bad");
    FAIL() << "a negative sync_us was accepted";
  } catch (const InvalidUsage& e) {
    EXPECT_NE(std::string(e.what()).find("host.sync_us"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace neuron::runtime
